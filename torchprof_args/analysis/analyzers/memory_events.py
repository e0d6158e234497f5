"""Memory seen by the profiler: peaks of the ``[memory]`` instant events, per device.

``torch.profiler(profile_memory=True)`` records one such event per allocation and free, with the
allocator's running totals; the loader keeps, per device code ``device_type * 65536 + device_id
+ 1``, their peaks and count.
"""

from __future__ import annotations

import msgspec

from torchprof_args.analysis.trace import Trace

__all__ = ["MemoryPeak", "memory_view"]


class MemoryPeak(msgspec.Struct, frozen=True, gc=False):
    """One device's ``[memory]`` samples: peak allocated / reserved bytes, how many samples."""

    device: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    samples: int


def memory_view(trace: Trace) -> list[MemoryPeak]:
    """Peak allocated / reserved bytes per device (``cpu``, ``cuda:0``...) and the sample count;
    empty without ``[memory]`` events."""
    mem = trace.memory
    out = []
    for i, code in enumerate(mem["device"]):
        dev_type, dev_id = divmod(int(code), 65536)
        dev_id -= 1
        kind = {0: "cpu", 1: "cuda"}.get(dev_type, f"device{dev_type}")
        label = kind if dev_id < 0 or kind == "cpu" else f"{kind}:{dev_id}"
        out.append(MemoryPeak(device=label, peak_allocated_bytes=int(mem["peak_allocated"][i]),
                              peak_reserved_bytes=int(mem["peak_reserved"][i]),
                              samples=int(mem["samples"][i])))
    return out
