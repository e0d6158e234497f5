"""Summarise a ``torch.cuda.memory._dump_snapshot`` pickle without trusting it.

Snapshot files are pickles, and unpickling runs code named by the file.  :class:`SafeUnpickler`
refuses every global (``find_class`` always raises), so only plain dicts, lists, tuples, strings,
numbers, booleans and None can be built; a file that needs anything else is rejected with a
TraceError, never executed.
"""

from __future__ import annotations

import io
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

from torchprof_args.errors import TraceError


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that can only build builtin containers and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: snapshots contain only plain data")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot dict of a ``_dump_snapshot`` pickle; TraceError for anything else."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        snap = SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise TraceError(f"{path}: not a plain-data memory snapshot ({exc})") from None
    except Exception as exc:  # truncated / not a pickle at all
        raise TraceError(f"{path}: not a readable pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise TraceError(f"{path}: not a torch.cuda.memory snapshot (no 'segments' list)")
    return snap


def _site(frames: Any) -> str:
    """The allocation's first frame in user code (not torch, not native), else its first frame."""
    if not isinstance(frames, list):
        return "<unknown>"
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename", ""))
        if (filename and not filename.startswith(("??", "<")) and "torch/" not in filename
                and not filename.endswith((".cpp", ".h", ".cu"))):
            return f"{filename}:{frame.get('line', '?')} ({frame.get('name', '?')})"
    for frame in frames:
        if isinstance(frame, dict) and frame.get("filename"):
            return f"{frame.get('filename')}:{frame.get('line', '?')} ({frame.get('name', '?')})"
    return "<no stack recorded>"


def summarize_snapshot(snap: dict[str, Any], top: int = 15) -> dict[str, Any]:
    """Reserved vs allocated per device, fragmentation, peak from the trace, top allocation sites."""
    devices: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for seg in snap["segments"]:
        if isinstance(seg, dict):
            _add_segment(seg, devices[int(seg.get("device", 0))], sites)
    # Peak allocated from the allocator's event history, when recorded.
    for index, trace in enumerate(snap.get("device_traces") or []):
        devices[index]["peak_allocated_in_history"] = _history_peak(trace or [])
        devices[index]["history_events"] = len(trace or [])
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "devices": [_device_row(index, devices[index]) for index in sorted(devices)],
        "top_sites": [{"site": s, "bytes": v[0], "blocks": v[1]} for s, v in ranked],
    }


def _add_segment(seg: dict[str, Any], dev: dict[str, int], sites: dict[str, list[int]]) -> None:
    """Add one allocator segment's sizes to its device's totals, and its live blocks to ``sites``."""
    dev["segments"] += 1
    dev["reserved"] += int(seg.get("total_size", 0))
    blocks = seg.get("blocks") or []
    allocated = 0
    largest_free = 0
    for block in blocks:
        if not isinstance(block, dict):
            continue
        size = int(block.get("size", 0))
        state = block.get("state")
        if state == "active_allocated":
            allocated += size
            dev["requested"] += int(block.get("requested_size", size))
            entry = sites[_site(block.get("frames"))]
            entry[0] += size
            entry[1] += 1
        elif state == "inactive":
            dev["free"] += size
            largest_free = max(largest_free, size)
    dev["allocated"] += int(seg.get("allocated_size", allocated)) if not blocks else allocated
    dev["largest_free_block"] = max(dev["largest_free_block"], largest_free)


def _history_peak(trace: list[Any]) -> int:
    """Largest live total in one device's allocation history (allocs minus completed frees)."""
    live, peak = 0, 0
    for entry in trace:
        if not isinstance(entry, dict):
            continue
        action, size = entry.get("action"), int(entry.get("size", 0))
        if action == "alloc":
            live += size
            peak = max(peak, live)
        elif action == "free_completed":
            live -= size
    return peak


def _device_row(index: int, d: dict[str, int]) -> dict[str, Any]:
    free = d["free"]
    return {
        "device": index,
        "segments": d["segments"],
        "reserved_bytes": d["reserved"],
        "allocated_bytes": d["allocated"],
        "requested_bytes": d["requested"],
        "cached_free_bytes": free,
        "largest_free_block_bytes": d["largest_free_block"],
        # Share of cached free memory not usable as one block: 0 = one contiguous free block.
        "fragmentation_pct": 100.0 * (1 - d["largest_free_block"] / free) if free else 0.0,
        "peak_allocated_in_history_bytes": d.get("peak_allocated_in_history"),
        "history_events": d.get("history_events", 0),
    }


def format_snapshot(summary: dict[str, Any], path: str) -> str:
    """``torchprof mem``'s text output for :func:`summarize_snapshot`'s result."""
    def mib(x: int | None) -> str:
        return "-" if x is None else f"{x / 2**20:,.1f} MiB"

    lines = [f"== {path}"]
    for d in summary["devices"]:
        lines += [
            f"device {d['device']}: reserved {mib(d['reserved_bytes'])} in {d['segments']} segments,"
            f" allocated {mib(d['allocated_bytes'])} (requested {mib(d['requested_bytes'])})",
            f"  cached free {mib(d['cached_free_bytes'])},"
            f" largest free block {mib(d['largest_free_block_bytes'])},"
            f" fragmentation {d['fragmentation_pct']:.1f}%",
            f"  peak allocated in recorded history: {mib(d['peak_allocated_in_history_bytes'])}"
            f" ({d['history_events']} events)",
        ]
    lines.append("Top allocation sites (live blocks):")
    for s in summary["top_sites"]:
        lines.append(f"  {mib(s['bytes']):>14} {s['blocks']:>6} blocks  {s['site']}")
    return "\n".join(lines) + "\n"
