"""Memory by category from a trace alone (a trace from elsewhere, or when the exporter could not run
PyTorch's categorisation): what it holds, and what it cannot tell.

A trace recorded with ``profile_memory`` has one ``[memory]`` event per allocation and free (the
block's address, its bytes, the allocator's totals); the operators, ``nn.Module`` and Python
frames around each tell where it was made.  Allocations are paired with their frees by address and
categorised by where they were made and how long they lived:

* made by ``AccumulateGrad`` (the backward pass): ``gradient``;
* made in ``Optimizer.step`` and kept after it: ``optimizer_state``; freed within it: ``temporary``;
* made in the forward part of a step and still held when its backward pass starts: ``activation``
  (the batch and the loss's saved tensors included); freed before: ``temporary``;
* made in the backward pass (activations' gradients): ``temporary``; anything else: ``other``.

Memory allocated before the window and held through it has no event of its own, only the
allocator's total: its split is **inferred** (and the part's notes say so): parameters as the bytes
of one step's gradients (every parameter trains, gradients in its dtype) or, under FSDP2
(``fully_shard``), as the rank's shards (what FSDP2 all-gathers in a step's forward), optimizer state as the
optimizer's usual multiple of them (Adam: 2, from the ``Optimizer.step#Adam.step`` annotation),
the rest ``other``.  Memory freed in ``zero_grad`` that was allocated before the window is
gradients.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.collectives import tensor_bytes
from torchprof_args.analysis.analyzers.fsdp import is_fsdp2
from torchprof_args.analysis.analyzers.nesting import Nesting
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.decode.comm_events import COMM_FIELDS
from torchprof_args.analysis.memory.breakdown import BEFORE_WINDOW, Allocations, Where, breakdown
from torchprof_args.analysis.memory.categories import (
    ACTIVATION,
    GRADIENT,
    OPTIMIZER_STATE,
    OTHER,
    PARAMETER,
    TEMPORARY,
    MemoryPart,
)
from torchprof_args.analysis.memory.places import MARKERS, PhaseClock, place_from_names
from torchprof_args.analysis.trace import MemoryRows, Trace
from torchprof_args.shared import formats

__all__ = ["OPTIMIZER_STATE_MULTIPLE", "device_label", "trace_identity", "trace_memory_part"]

#: optimizer state as a multiple of the parameters' bytes (fp32 state), by the optimizer's class.
OPTIMIZER_STATE_MULTIPLE = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "FusedAdam": 2,
                            "Lamb": 2, "Adagrad": 1, "RMSprop": 1, "Adadelta": 2, "SGD": 1}
_OP_CATS = ("cpu_op", "user_annotation")
_BACKWARD = ("autograd::engine::evaluate_function",)
_ACCUMULATE = ("torch::autograd::AccumulateGrad",)
#: FSDP2's annotation at each parameter group's backward: a step's first is where its forward ended.
_FSDP_PRE_BACKWARD = "FSDP::pre_backward"
#: the operator FSDP2 all-gathers a group's shards with: its input (the second) is the rank's shard.
_ALLGATHER_BASE = "c10d::_allgather_base_"


def device_label(code: int) -> str:
    """``cpu`` / ``cuda:N`` of a ``[memory]`` device code (``device_type * 65536 + device_id + 1``)."""
    kind, index = divmod(int(code), 65536)
    name = {0: "cpu", 1: "cuda"}.get(kind, f"device{kind}")
    return name if name == "cpu" or index - 1 < 0 else f"{name}:{index - 1}"


def trace_identity(trace: Trace) -> dict[str, object]:
    """The rank, world size, pipeline stage and parallel coordinates a trace states, and whether its
    model is FSDP2's."""
    found = trace.metadata.get("torchprof_args")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    pipeline = meta.get("pipeline")
    stage = pipeline.get("stage") if isinstance(pipeline, dict) else None
    coords = meta.get("parallel")
    rank = trace.rank if trace.rank is not None else meta.get("rank")
    return {"rank": rank if isinstance(rank, int) else None, "world_size": trace.world_size,
            "stage": stage if isinstance(stage, int) else None,
            "coordinates": {k: v for k, v in coords.items() if isinstance(v, int)} if isinstance(coords, dict)
            else None, "fsdp2": is_fsdp2(trace)}


def trace_memory_part(trace: Trace) -> MemoryPart:
    """The memory breakdown of a trace loaded with ``memory_rows=True`` (see the module)."""
    rows = trace.memory_rows
    if rows is None or not len(rows):
        return MemoryPart(format=formats.MEMORY.version, source="none", notes=[
            "the trace has no [memory] events: record them with --torch-profile-profile-memory"],
            devices=[], **trace_identity(trace))  # type: ignore[arg-type]
    context = _Context(trace, rows)
    notes = ["categorised from the trace (not by PyTorch's memory profiler): the batch and the loss's saved "
             "tensors count as activations"]
    devices = []
    for code in np.unique(rows.columns["device"]).tolist():
        allocs = _allocations(trace, rows, context, int(code), notes)
        found = breakdown(allocs)
        if found is not None:
            devices.append(found)
    devices.sort(key=lambda d: -d.peak_bytes)
    return MemoryPart(format=formats.MEMORY.version, source="trace", notes=list(dict.fromkeys(notes)),
                      devices=devices, **trace_identity(trace))  # type: ignore[arg-type]


class _Context:
    """Where each ``[memory]`` event happened (an index into ``places``), whether in ``AccumulateGrad``."""

    def __init__(self, trace: Trace, rows: MemoryRows) -> None:
        names, ts = trace.names, rows.columns["ts"]
        wanted = lookup(trace.cats, (*_OP_CATS, "python_function"))
        cpu = np.flatnonzero(wanted[trace.cat_id] & (trace.stream == -1))
        is_op = lookup(trace.cats, _OP_CATS)[trace.cat_id[cpu]]
        ends = trace.ts[cpu] + np.maximum(trace.dur[cpu], 0.0)
        marker = lookup(names, lambda n: n.startswith(MARKERS))[trace.name_id[cpu]]
        marks = [(names[trace.name_id[i]], float(trace.ts[i]), float(e))
                 for i, e in zip(cpu[marker], ends[marker], strict=True)]
        self.steps = sorted((m for m in marks if m[0].startswith(MARKERS[0])), key=lambda m: m[1])
        is_backward = lookup(names, lambda n: n.startswith(_BACKWARD))[trace.name_id[cpu]]
        bw_start, bw_end = trace.ts[cpu[is_backward]], ends[is_backward]
        self.clock = PhaseClock(marks, zip(bw_start.tolist(), bw_end.tolist(), strict=True))
        #: per step ``(start, end, backward's start, backward's end)`` (the step's end: no backward pass)
        self.backward = []
        for _, s, e in self.steps:
            inside = (bw_start >= s) & (bw_start <= e)
            self.backward.append((s, e, float(bw_start[inside].min()) if inside.any() else e,
                                  float(bw_end[inside].max()) if inside.any() else e))
        self.places: list[Where] = []
        self._index: dict[Where, int] = {}
        self.where = np.zeros(len(ts), dtype=np.int32)
        self.accumulate = np.zeros(len(ts), dtype=bool)
        thread_of = {t: i for i, t in enumerate(trace.threads)}
        for k, thread in enumerate(rows.threads):
            mine = np.flatnonzero(rows.columns["thread"] == k)
            sel = trace.thread_id[cpu] == thread_of.get(thread, -1)
            self._fill(trace, mine, ts[mine], cpu[sel], ends[sel], is_op[sel])

    def index(self, place: Where) -> int:
        """The index of ``place`` in :attr:`places` (added when new)."""
        found = self._index.get(place)
        if found is None:
            found = self._index[place] = len(self.places)
            self.places.append(place)
        return found

    def category(self, phase: str, accumulate: bool, start: float, end: float) -> int:
        """The category of an allocation made in ``phase`` at ``start`` and freed at ``end``."""
        if accumulate:
            return GRADIENT
        if phase == "optimizer":
            span = self.clock.within(self.clock.optimizer, start)
            return TEMPORARY if span is not None and end <= span[1] else OPTIMIZER_STATE
        found = bisect.bisect_right(self.backward, (start, math.inf)) - 1
        step = self.backward[found][2:] if found >= 0 and self.backward[found][1] >= start else None
        if phase == "backward":  # a gradient outlives the backward pass, an activation's gradient does not
            return GRADIENT if step is not None and end > step[1] else TEMPORARY
        if phase == "forward":
            return ACTIVATION if step is None or end > step[0] else TEMPORARY
        if phase == "after_backward":  # made for the optimizer (a flattened gradient, a norm): not saved
            return TEMPORARY if found >= 0 and end <= self.backward[found][1] else OTHER
        return OTHER

    def _fill(self, trace: Trace, rows: np.ndarray, ts: np.ndarray, events: np.ndarray, ends: np.ndarray,
              is_op: np.ndarray) -> None:
        """The places of one thread's ``[memory]`` events ``rows`` (at ``ts``) among its ``events``."""
        names = trace.names
        name_id = trace.name_id[events]

        def innermost(mask: np.ndarray) -> np.ndarray:
            """Per moment, the name id of the innermost event of ``mask`` around it (-1: none)."""
            among = name_id[mask]
            if not len(among):  # e.g. a gloo worker thread: no operator (or no backward one) at all
                return np.full(len(ts), -1, dtype=np.int64)
            found = Nesting(trace.ts[events[mask]], ends[mask]).innermost(ts)
            return np.where(found >= 0, among[np.maximum(found, 0)], -1)

        backward_name = lookup(names, lambda n: n.startswith(_BACKWARD))[name_id]
        accumulate_name = lookup(names, lambda n: n.startswith(_ACCUMULATE))[name_id]
        ops = [names[i] if i >= 0 else None for i in innermost(is_op).tolist()]
        backward = (innermost(is_op & backward_name) >= 0).tolist()
        accumulate = (innermost(is_op & accumulate_name) >= 0).tolist()
        python = np.flatnonzero(~is_op)
        nesting = Nesting(trace.ts[events[python]], ends[python])
        python_names = name_id[python]
        chains: dict[int, tuple[str | None, str | None]] = {-1: (None, None)}
        for k, (row, inner) in enumerate(zip(rows.tolist(), nesting.innermost(ts).tolist(), strict=True)):
            if inner not in chains:
                chain = [names[python_names[j]] for j in nesting.chain(inner)]
                place = place_from_names("", [], chain)
                chains[inner] = (place.module, place.site)
            module, site = chains[inner]
            phase = self.clock.phase(float(ts[k]), [_BACKWARD[0]] if backward[k] or accumulate[k] else [])
            self.where[row] = self.index(Where(phase, ops[k], module, site))
            self.accumulate[row] = accumulate[k]


def _allocations(trace: Trace, rows: MemoryRows, context: _Context, code: int,
                 notes: list[str]) -> Allocations:
    """One device's allocations: paired by address, categorised, with the inferred baseline."""
    cols = rows.columns
    sel = np.flatnonzero(cols["device"] == code)
    sel = sel[np.lexsort((sel, cols["ts"][sel]))]
    ts, size, addr = cols["ts"][sel], cols["bytes"][sel], cols["addr"][sel]
    by_addr = np.lexsort((np.arange(len(sel)), addr))  # each address's events in time order
    pair = (addr[by_addr][1:] == addr[by_addr][:-1]) & (size[by_addr][:-1] > 0) & (size[by_addr][1:] < 0)
    free_of = {int(by_addr[i]): int(by_addr[i + 1]) for i in np.flatnonzero(pair).tolist()}
    paired_frees = set(free_of.values())
    table: list[tuple[float, float, int, int, int]] = []  # start, end, bytes, category, place
    for k, row in enumerate(sel.tolist()):
        where = int(context.where[row])
        phase = context.places[where].phase
        if size[k] > 0:
            start = float(ts[k])
            end = float(ts[free_of[k]]) if k in free_of else float("inf")
            category = context.category(phase, bool(context.accumulate[row]), start, end)
        elif k not in paired_frees:  # the free of memory allocated before the window
            start, end = float("-inf"), float(ts[k])
            category = GRADIENT if phase == "zero_grad" else OTHER
        else:
            continue
        table.append((start, end, abs(int(size[k])), category, where))
    # the CPU allocator's totals in a trace count only what was allocated while recording
    held = _held_before(cols, sel, table) if code >= 65536 else None
    other = context.index(Where("other", site=BEFORE_WINDOW))
    table += [(float("-inf"), float("inf"), nbytes, category, other)
              for category, nbytes in _split_held(trace, held, table, context.steps, notes) if nbytes > 0]
    arr = np.array(table, dtype=np.float64).reshape(-1, 5)
    reserved = cols["reserved"][sel]
    return Allocations(
        device=device_label(code), start=arr[:, 0], end=arr[:, 1], size=arr[:, 2].astype(np.int64),
        category=arr[:, 3].astype(np.int8), where=arr[:, 4].astype(np.int32), places=context.places,
        window=(float(ts.min()), float(ts.max())), steps=context.steps,
        peak_reserved=int(reserved.max()) if len(reserved) and reserved.max() > 0 else None)


def _held_before(cols: dict[str, np.ndarray], sel: np.ndarray,
                 table: list[tuple[float, float, int, int, int]]) -> int:
    """Bytes allocated before the window and held through it: the allocator's total before the first
    event, less what the window frees of it."""
    first = int(sel[0])
    if cols["allocated"][first] < 0:
        return 0
    before = int(cols["allocated"][first]) - int(cols["bytes"][first])
    freed_early = sum(size for start, _, size, _, _ in table if start == float("-inf"))
    return max(0, before - freed_early)


def _split_held(trace: Trace, held: int | None, table: list[tuple[float, float, int, int, int]],
                steps: list[tuple[str, float, float]], notes: list[str]) -> list[tuple[int, int]]:
    """The inferred split of the memory held through the window (``held``; None: not measured, as on
    the CPU): parameters, optimizer state, other."""
    if held is not None and held <= 0:
        return []
    made = np.array([(start, size) for start, _, size, cat, _ in table
                     if cat == GRADIENT and start > -math.inf], dtype=np.float64).reshape(-1, 2)
    order = np.argsort(made[:, 0])
    starts, totals = made[order, 0], np.r_[0.0, np.cumsum(made[order, 1])]
    per_step = [totals[np.searchsorted(starts, e)] - totals[np.searchsorted(starts, s)] for _, s, e in steps]
    grad_bytes = int(max(per_step or [totals[-1]]))
    if not grad_bytes:
        notes.append("the memory held before the window is not split: no gradient was made in it to size the "
                     "parameters by")
        return [(OTHER, held or 0)]
    optimizer = _optimizer_name(trace)
    made_state = sum(size for start, end, size, cat, _ in table if cat == OPTIMIZER_STATE)
    multiple = OPTIMIZER_STATE_MULTIPLE.get(optimizer or "")
    shards = _fsdp_shard_bytes(trace, steps)
    sized_by = (f"the rank's FSDP2 shards, as its forward all-gathers them ({shards / 2**20:.1f} MiB)"
                if shards else f"the bytes of one step's gradients ({grad_bytes / 2**20:.1f} MiB, every "
                               "parameter training)")
    measured = shards or grad_bytes
    parameters = measured if held is None else min(measured, held)
    rest = None if held is None else held - parameters
    guess = None if multiple is None else max(0, multiple * parameters - made_state)
    state = (guess or 0) if rest is None else rest if guess is None else min(rest, guess)
    how = (f"optimizer state as {multiple}x them ({optimizer}, state in the parameters' dtype)"
           if multiple is not None else
           f"optimizer state {'as the rest of the memory held' if held else 'unknown'} (optimizer "
           f"{optimizer or 'not recorded'})")
    notes.append(f"parameters inferred as {sized_by}; {how}")
    if held is None:
        notes.append("the CPU allocator's totals count only what was allocated while recording: memory held "
                     "before the window is inferred, not measured")
        return [(PARAMETER, parameters), (OPTIMIZER_STATE, state)]
    return [(PARAMETER, parameters), (OPTIMIZER_STATE, state), (OTHER, (rest or 0) - state)]


def _fsdp_shard_bytes(trace: Trace, steps: list[tuple[str, float, float]]) -> int | None:
    """The parameter bytes a rank holds under FSDP2 (``fully_shard``): its shards, which FSDP2
    all-gathers once per parameter group in a step's forward (the inputs of the step's
    ``c10d::_allgather_base_`` before its first ``FSDP::pre_backward``; in the all-gather's dtype).
    None: no FSDP2 step in the trace, or shapes (``record_shapes``) not recorded."""
    if trace.comms is None or not any(name.startswith(_FSDP_PRE_BACKWARD) for name in trace.names):
        return None
    backward = lookup(trace.names, lambda name: name.startswith(_FSDP_PRE_BACKWARD))[trace.name_id]
    starts = np.sort(trace.ts[backward])
    ts, name, dims, types = (COMM_FIELDS.index(f) for f in ("ts", "name", "input_dims", "input_type"))
    gathers = [(row[ts], tensor_bytes(row[dims], row[types], 1)) for row in trace.comms
               if row[name] == _ALLGATHER_BASE]
    for _, start, end in steps:
        first = int(np.searchsorted(starts, start))
        if first == len(starts) or starts[first] > end:
            continue
        forward = [size for at, size in gathers if start <= at < starts[first]]
        if forward and None not in forward:
            return sum(size for size in forward if size is not None)
    return None


def _optimizer_name(trace: Trace) -> str | None:
    """The optimizer's class, from its ``Optimizer.step#<Class>.step`` annotation."""
    for name in trace.names:
        if name.startswith(MARKERS[1]):
            return name[len(MARKERS[1]):].split(".")[0]
    return None
