"""Read a ``torch.cuda.memory._dump_snapshot`` pickle without trusting it, and summarise it.

Snapshot files are pickles, and unpickling runs code named by the file.  :class:`SafeUnpickler`
refuses every global (``find_class`` always raises), so only plain dicts, lists, tuples, strings,
numbers, booleans and None can be built; a file that needs anything else is rejected with a
TraceError naming it, never executed.  The file is read as a stream (the unpickler pulls it frame by
frame, never the whole file at once), and the allocator history is turned into columns at once
(:mod:`.snapshot_history`, ~40 bytes an entry) so the entries' objects are freed: 1M entries in
under 10 s and 2 GB (``benchmarks/bench_memory.py``).

:func:`summarize_snapshot` gives, per device, the allocator's state at the dump (reserved vs
allocated, the cached free memory and its largest block: the fragmentation), the live blocks' top
allocation sites, the history's breakdown by category (:mod:`.breakdown`) and, for an ``oom``
entry, the explanation (:mod:`.oom`).
"""

from __future__ import annotations

import gzip
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec

from torchprof_args.analysis.memory.breakdown import breakdown
from torchprof_args.analysis.memory.categories import DeviceMemory, Site
from torchprof_args.analysis.memory.oom import OomExplanation, explain_oom
from torchprof_args.analysis.memory.snapshot_history import (
    frames_site,
    history_allocations,
    read_history,
)
from torchprof_args.errors import TraceError

__all__ = ["SNAPSHOT_NOTE", "AllocatorState", "SafeUnpickler", "SnapshotSummary", "load_snapshot",
           "summarize_snapshot"]

#: what a snapshot's categories rest on.
SNAPSHOT_NOTE = ("a snapshot's categories are inferred from each block's Python stack (optimizer, "
                 "backward, module init or forward code); blocks with no stack (the autograd engine's "
                 "thread) are other")


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that can only build builtin containers and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: snapshots contain only plain data")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot dict of a ``_dump_snapshot`` pickle (gzip-compressed when its name ends with
    ``.gz``); TraceError (one line naming the file) for anything else."""
    path = Path(path)
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as handle:
            snap = SafeUnpickler(handle).load()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except pickle.UnpicklingError as exc:
        raise TraceError(f"{path}: not a plain-data memory snapshot ({exc})") from None
    except MemoryError:
        raise TraceError(f"{path}: out of memory while reading the snapshot") from None
    except Exception as exc:  # noqa: BLE001 - truncated / not a pickle at all
        raise TraceError(f"{path}: not a readable pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise TraceError(f"{path}: not a torch.cuda.memory snapshot (no 'segments' list)")
    return snap


class AllocatorState(msgspec.Struct, frozen=True):
    """One device's allocator at the dump: reserved vs allocated, and the free memory it caches.

    ``fragmentation_pct``: the share of the cached free memory not usable as one block (0: one
    contiguous free block).  ``expandable_segments``: whether the allocator maps segments that grow
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), None when the snapshot does not say.
    """

    device: int
    segments: int
    reserved_bytes: int
    allocated_bytes: int
    requested_bytes: int
    cached_free_bytes: int
    largest_free_block_bytes: int
    fragmentation_pct: float
    expandable_segments: bool | None
    peak_allocated_in_history_bytes: int | None
    history_events: int


class SnapshotSummary(msgspec.Struct, frozen=True):
    """``torchprof mem``'s view of one snapshot."""

    path: str
    devices: list[AllocatorState]
    top_sites: list[Site]
    memory: list[DeviceMemory]
    oom: OomExplanation | None
    notes: list[str]


def _expandable(snap: dict[str, Any]) -> bool | None:
    settings = snap.get("allocator_settings")
    if isinstance(settings, dict):
        if isinstance(settings.get("expandable_segments"), bool):
            return bool(settings["expandable_segments"])
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
        if isinstance(conf, str):
            return "expandable_segments:true" in conf.replace(" ", "").lower()
    flags = [s.get("is_expandable") for s in snap["segments"] if isinstance(s, dict)]
    return any(f is True for f in flags) if any(isinstance(f, bool) for f in flags) else None


def summarize_snapshot(snap: dict[str, Any], path: str = "", top: int = 15) -> SnapshotSummary:
    """Per device the allocator's state, the live blocks' top sites, the history's breakdown and the
    explanation of its last ``oom`` entry."""
    totals: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    live: dict[int, list[tuple[int, int, Any]]] = defaultdict(list)
    for seg in snap["segments"]:
        if isinstance(seg, dict):
            device = _int(seg.get("device"))
            _add_segment(seg, totals[device], sites, live[device])
    found_traces = snap.get("device_traces")
    traces: list[Any] = found_traces if isinstance(found_traces, list) else []
    expandable = _expandable(snap)
    devices, memory, oom = [], [], None
    for device in sorted(set(totals) | set(range(len(traces)))):
        history = read_history(traces[device] if device < len(traces) else [])
        allocs = history_allocations(history, f"cuda:{device}", live[device]) if len(history) else None
        found = breakdown(allocs) if allocs is not None else None
        if found is not None:
            memory.append(found)
        devices.append(_state(device, totals[device], expandable, found, len(history)))
        if history.ooms:
            oom = explain_oom(history, devices[-1], live[device], f"cuda:{device}")
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
    top_sites = [Site(site, v[0], v[1], "") for site, v in ranked]
    notes = [SNAPSHOT_NOTE] if memory or oom else []
    return SnapshotSummary(path=path, devices=devices, top_sites=top_sites, memory=memory, oom=oom,
                           notes=notes)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _add_segment(seg: dict[str, Any], dev: dict[str, int], sites: dict[str, list[int]],
                 live: list[tuple[int, int, Any]]) -> None:
    """Add one allocator segment's sizes to its device's totals, its live blocks to ``sites`` and
    ``live``."""
    dev["segments"] += 1
    dev["reserved"] += _int(seg.get("total_size"))
    found = seg.get("blocks")
    blocks: list[Any] = found if isinstance(found, list) else []
    allocated = 0
    for block in blocks:
        if not isinstance(block, dict):
            continue
        size = _int(block.get("size"))
        state = block.get("state")
        if state == "active_allocated":
            allocated += size
            dev["requested"] += _int(block.get("requested_size")) or size
            entry = sites[frames_site(block.get("frames"))]
            entry[0] += size
            entry[1] += 1
            live.append((_int(block.get("address")), size, block.get("frames")))
        elif state == "inactive":
            dev["free"] += size
            dev["largest_free_block"] = max(dev["largest_free_block"], size)
    dev["allocated"] += allocated if blocks else _int(seg.get("allocated_size"))


def _state(device: int, d: dict[str, int], expandable: bool | None, found: DeviceMemory | None,
           events: int) -> AllocatorState:
    free = d["free"]
    return AllocatorState(
        device=device, segments=d["segments"], reserved_bytes=d["reserved"], allocated_bytes=d["allocated"],
        requested_bytes=d["requested"], cached_free_bytes=free,
        largest_free_block_bytes=d["largest_free_block"],
        fragmentation_pct=100.0 * (1 - d["largest_free_block"] / free) if free else 0.0,
        expandable_segments=expandable,
        peak_allocated_in_history_bytes=found.peak_bytes if found is not None else None,
        history_events=events)

