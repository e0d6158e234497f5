"""A CUDA memory snapshot's allocator history as columns, categorised by its stacks; its OOM events.

``torch.cuda.memory._record_memory_history`` keeps the allocator's last ``max_entries`` actions per
device (``device_traces``): ``alloc``, ``free_requested`` / ``free_completed``, ``segment_alloc`` /
``segment_free``, ``oom`` (the request that failed and the memory CUDA reported free) with the
Python stack of each.  :func:`history_allocations` pairs each ``alloc`` with its
``free_completed`` by address into :class:`~.breakdown.Allocations` (blocks live at the snapshot with
no ``alloc`` in the history were allocated before it began), so a snapshot has the same breakdown
as a trace: the peak, what was live then, a timeline.

A snapshot has no operators, so the category of a block is **inferred from its stack** (the
report's notes say so): frames in ``torch/optim`` (optimizer state when kept, else temporary), in
``backward`` (a gradient when kept past the backward pass), in a module's ``__init__`` / ``_apply``
/ ``load_state_dict`` (parameters), in a module's ``forward`` (an activation when kept, else
temporary); none of these: ``other``.  The stacks are shared between entries (PyTorch symbolises
each distinct traceback once), so each distinct one is read once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from torchprof_args.analysis.memory.breakdown import Allocations, Where
from torchprof_args.analysis.memory.categories import (
    ACTIVATION,
    GRADIENT,
    OPTIMIZER_STATE,
    OTHER,
    PARAMETER,
    TEMPORARY,
)

__all__ = ["ACTIONS", "History", "OomEvent", "frames_site", "history_allocations", "read_history",
           "stack_category"]

#: the allocator actions kept, by code.
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot",
           "segment_map", "segment_unmap")
_CODE = {name: i for i, name in enumerate(ACTIONS)}
ALLOC, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, OOM = (_CODE[n] for n in (
    "alloc", "free_completed", "segment_alloc", "segment_free", "oom"))
_LIBRARY = ("torch/", "<", "/lib/python3", "site-packages/torch", "threading.py", "contextlib.py", "runpy.py")
#: a block's size is clipped here (a corrupt entry must not overflow the sums).
_MAX_SIZE = 2**48
_INIT = ("__init__", "_apply", "reset_parameters", "load_state_dict", "_load_from_state_dict", "cuda", "to")


@dataclass(frozen=True)
class OomEvent:
    """One ``oom`` entry: the request that failed and what CUDA reported free then."""

    index: int
    time_us: float
    requested_bytes: int
    device_free_bytes: int | None
    stream: int
    site: str


@dataclass
class History:
    """One device's allocator history as columns (in history order); ``stack[k]`` indexes
    ``stacks``: each distinct stack's ``(site, kind)`` (:func:`stack_category`'s hint)."""

    action: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    time_us: np.ndarray
    stack: np.ndarray
    stacks: list[tuple[str, str]]
    ooms: list[OomEvent]

    def __len__(self) -> int:
        return len(self.action)


def _frames(frames: Any) -> list[tuple[str, int, str]]:
    if not isinstance(frames, list):
        return []
    out = []
    for frame in frames:
        if isinstance(frame, dict):
            out.append((str(frame.get("filename", "")), _int(frame.get("line")), str(frame.get("name", ""))))
    return out


def frames_site(frames: Any) -> str:
    """The allocation's first frame in the job's own code (not torch, not native), else its first
    frame: ``file:line (function)``."""
    parsed = _frames(frames)
    for filename, line, name in parsed:
        native = filename.endswith((".cpp", ".h", ".cu"))
        if filename and not native and not any(p in filename for p in _LIBRARY):
            return f"{filename}:{line} ({name})"
    for filename, line, name in parsed:
        if filename:
            return f"{filename}:{line} ({name})"
    return "<no stack recorded>"


def stack_category(frames: Any) -> str:
    """What a stack says of its allocation: ``optimizer``, ``backward``, ``init``, ``forward`` or ``""``."""
    parsed = _frames(frames)
    if any("torch/optim/" in f or "/optim" in f and n in ("step", "_init_group") for f, _, n in parsed):
        return "optimizer"
    if any(n in ("backward", "_engine_run_backward", "run_backward") for _, _, n in parsed):
        return "backward"
    if any("nn/modules" in f and n in _INIT or n in ("_apply", "load_state_dict") for f, _, n in parsed):
        return "init"
    if any("nn/modules" in f and n in ("forward", "_call_impl", "_wrapped_call_impl") for f, _, n in parsed):
        return "forward"
    return ""


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def read_history(entries: Any) -> History:
    """One device's ``device_traces`` entries as :class:`History` (entries that are not dicts, or
    whose action is unknown, are skipped)."""
    entries = entries if isinstance(entries, list) else []
    n = len(entries)
    action = np.full(n, -1, dtype=np.int8)
    addr = np.zeros(n, dtype=np.uint64)
    size = np.zeros(n, dtype=np.int64)
    time_us = np.arange(n, dtype=np.float64)
    stack = np.zeros(n, dtype=np.int32)
    stacks: list[tuple[str, str]] = []
    seen: dict[int, int] = {}
    ooms: list[OomEvent] = []
    has_time = False
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        code = _CODE.get(entry.get("action"))  # type: ignore[arg-type]
        if code is None:
            continue
        action[k] = code
        addr[k] = max(0, min(_int(entry.get("addr")), 2**64 - 1))
        size[k] = max(0, min(_int(entry.get("size")), _MAX_SIZE))
        when = entry.get("time_us")
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            time_us[k] = float(when)
            has_time = True
        frames = entry.get("frames")
        key = id(frames)
        index = seen.get(key)
        if index is None:
            index = seen[key] = len(stacks)
            stacks.append((frames_site(frames), stack_category(frames)))
        stack[k] = index
        if code == OOM:
            free = entry.get("device_free")
            ooms.append(OomEvent(k, float(when) if isinstance(when, (int, float)) else float(k), int(size[k]),
                                 _int(free) if isinstance(free, int) else None, _int(entry.get("stream")),
                                 stacks[index][0]))
    if not has_time:
        time_us = np.arange(n, dtype=np.float64)
    return History(action, addr, size, time_us, stack, stacks, ooms)


_KINDS = ("", "optimizer", "backward", "init", "forward")
_PHASE = {"optimizer": "optimizer", "backward": "backward", "forward": "forward"}
#: category by (kind, kept)
_CATEGORY = np.array([[OTHER, OTHER], [TEMPORARY, OPTIMIZER_STATE], [TEMPORARY, GRADIENT],
                      [PARAMETER, PARAMETER], [TEMPORARY, ACTIVATION]], dtype=np.int8)


def history_allocations(history: History, device: str, live_blocks: list[tuple[int, int, Any]],
                        until: int | None = None) -> Allocations:
    """The history's allocations (up to entry ``until``, e.g. an OOM) as one device's table.

    ``live_blocks`` are the snapshot's ``(address, size, frames)`` of allocated blocks: those with no
    ``alloc`` in the history were allocated before it began (live throughout).  A block is "kept" when
    it is still allocated at the end of the history (or at ``until``).
    """
    end = len(history) if until is None else until
    action, addr = history.action[:end], history.addr[:end]
    sel = np.flatnonzero((action == ALLOC) | (action == FREE_COMPLETED))
    order = sel[np.lexsort((sel, addr[sel]))]  # each address's allocations and frees in history order
    pair = ((addr[order][1:] == addr[order][:-1]) & (action[order][:-1] == ALLOC)
            & (action[order][1:] == FREE_COMPLETED))
    allocs = np.flatnonzero(action == ALLOC)
    free_of = np.full(end, -1, dtype=np.int64)
    free_of[order[:-1][pair]] = order[1:][pair]
    freed = free_of[allocs]
    kept = freed < 0
    places: list[Where] = []
    index: dict[Where, int] = {}

    def place(site: str, kind: str) -> int:
        where = Where(_PHASE.get(kind, "other"), None, None, site)
        if where not in index:
            index[where] = len(places)
            places.append(where)
        return index[where]

    stack_kind = np.array([_KINDS.index(kind) for _, kind in history.stacks] or [0], dtype=np.int8)
    stack_place = np.array([place(site, kind) for site, kind in history.stacks] or [0], dtype=np.int32)
    stack = history.stack[allocs]
    starts = history.time_us[allocs]
    ends = np.where(kept, np.inf, history.time_us[np.maximum(freed, 0)])
    sizes = history.size[allocs]
    cats = _CATEGORY[stack_kind[stack], kept.astype(np.int8)]
    wheres = stack_place[stack]
    seen = set(addr[allocs].tolist())
    before = [(size, stack_category(frames), frames_site(frames)) for a, size, frames in live_blocks
              if a not in seen]
    if before:
        starts = np.r_[starts, np.full(len(before), -np.inf)]
        ends = np.r_[ends, np.full(len(before), np.inf)]
        sizes = np.r_[sizes, np.array([b[0] for b in before], dtype=np.int64)]
        cats = np.r_[cats, np.array([_CATEGORY[_KINDS.index(b[1]), 1] for b in before], dtype=np.int8)]
        wheres = np.r_[wheres, np.array([place(b[2], b[1]) for b in before], dtype=np.int32)]
    times = history.time_us[:end]
    window = (float(times.min()), float(times.max())) if len(times) else (0.0, 0.0)
    return Allocations(device=device, start=starts.astype(np.float64), end=ends.astype(np.float64),
                       size=sizes.astype(np.int64), category=cats.astype(np.int8),
                       where=wheres.astype(np.int32), places=places, window=window)
