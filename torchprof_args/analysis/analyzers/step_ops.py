"""Operators and kernels inside the profiled steps, per name: what ``torchprof diff`` compares.

The rules are Holistic Trace Analysis' ``TraceDiff`` (``hta.trace_diff``), so a diff can be
checked against it:

* a CPU event belongs to step ``ProfilerStep#N`` when it starts inside that annotation's span
  (``start <= ts < start + dur``); events outside every step are not counted;
* a GPU event (kernel, memcpy, memset: an event with a CUDA stream) belongs to the step of the
  runtime call that launched it (same correlation id);
* events are grouped by name: number of calls and total duration.

CPU events are the operator tree's (``cpu_op``, ``user_annotation``, ``cuda_runtime``,
``cuda_driver``; Python stack frames are left out), without the ``ProfilerStep#N`` annotations
themselves (their names differ from step to step).  Totals are over all steps; the step count
comes with them, so two traces with different numbers of steps compare per step.
"""

from __future__ import annotations

import bisect

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.cpu_ops import cpu_ops, cpu_tree
from torchprof_args.analysis.analyzers.gpu import kernel_type
from torchprof_args.analysis.analyzers.select import lookup, member
from torchprof_args.analysis.analyzers.steps import STEP_RE, steps
from torchprof_args.analysis.trace import Trace

__all__ = ["StepKernel", "StepOperator", "StepOps", "step_ops"]

#: GPU-side events that are annotations, not work.
_GPU_ANNOTATION_CATS = ("gpu_user_annotation",)


class StepOperator(msgspec.Struct, frozen=True, gc=False):
    """One CPU event name inside the steps: its category, calls and total time (us)."""

    name: str
    cat: str
    calls: int
    total_us: float


class StepKernel(msgspec.Struct, frozen=True, gc=False):
    """One GPU event name launched from inside the steps: its class (as in the kernel breakdown),
    calls and total time (us)."""

    name: str
    type: str
    calls: int
    total_us: float


class StepOps(msgspec.Struct, frozen=True):
    """A summary's ``ops_in_steps``: the steps counted, and per name what ran inside them,
    longest total first (``torchprof diff`` compares these per rank and step)."""

    steps: int
    cpu: list[StepOperator]
    gpu: list[StepKernel]


def step_ops(trace: Trace, top: int | None = None) -> StepOps:
    """Per name, calls and total time inside the steps.

    Args:
        trace: the trace.
        top: names to keep of each list, longest total first (None: all).

    Returns:
        The CPU operators and the GPU events (none without ProfilerStep annotations).
    """
    spans = steps(trace)
    if not spans:
        return StepOps(steps=0, cpu=[], gpu=[])
    starts = np.array([s["start_us"] for s in spans])
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    ends = starts + np.array([s["dur_us"] for s in spans])[order]
    outside = _outside_steps(trace, starts, ends)
    cpu_calls, cpu_time = _cpu_in_steps(trace, outside)
    gpu_calls, gpu_time = _gpu_in_steps(trace, outside)
    name_cat = trace.name_cat
    return StepOps(
        steps=len(spans),
        cpu=[StepOperator(trace.names[i], trace.cats[name_cat[i]] if name_cat is not None else "", calls, us)
             for i, calls, us in _rows(cpu_calls, cpu_time, top)],
        gpu=[StepKernel(trace.names[i], kernel_type(trace.names[i]), calls, us)
             for i, calls, us in _rows(gpu_calls, gpu_time, top)],
    )


class _StartsOf:
    """``trace.ts[idx[lo + k]]`` as a sequence, for :mod:`bisect` (no array of the thread's starts)."""

    def __init__(self, trace: Trace, idx: np.ndarray, lo: int, hi: int) -> None:
        self.ts, self.idx, self.lo, self.n = trace.ts, idx, lo, hi - lo

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> float:
        return float(self.ts[self.idx[self.lo + k]])


def _outside_steps(trace: Trace, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The CPU tree's events (indices into the trace) that start outside every step.

    Within a thread the tree has its events sorted by start, so each step is a range of them,
    found by two binary searches; the events outside are the gaps between those ranges (usually
    few), taken without any temporary the size of the thread.
    """
    tree = cpu_tree(trace)
    idx, bounds = tree["idx"], tree["bounds"]
    outside = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        view = _StartsOf(trace, idx, lo, hi)
        ranges = sorted((bisect.bisect_left(view, a), bisect.bisect_left(view, b))
                        for a, b in zip(starts.tolist(), ends.tolist(), strict=True))
        position = 0
        for a, b in ranges:
            if a > position:
                outside.append(idx[lo + position : lo + a])
            position = max(position, b)
        if position < hi - lo:
            outside.append(idx[lo + position : hi])
    return np.concatenate(outside) if outside else np.zeros(0, dtype=np.int32)


def _cpu_in_steps(trace: Trace, outside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calls and time per name of the CPU events inside a step: every tree event's (from
    :func:`cpu_ops`) less those outside the steps; ``ProfilerStep#N`` themselves left out."""
    ops = cpu_ops(trace)
    size = len(trace.names)
    names = trace.name_id[outside]
    calls = ops["calls"] - np.bincount(names, minlength=size)
    time = ops["cpu_total"] - np.bincount(names, weights=trace.dur[outside], minlength=size)
    is_step = lookup(trace.names, STEP_RE.match)[:size]
    calls[is_step] = 0
    time[is_step] = 0.0
    return calls, np.maximum(time, 0.0)


def _gpu_in_steps(trace: Trace, outside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calls and time per name of the GPU events launched from inside a step: those whose
    correlation id a CPU event launched, but not one outside the steps."""
    size = len(trace.names)
    on_gpu = (trace.stream >= 0) & (trace.corr >= 0)
    on_gpu &= ~lookup(trace.cats, _GPU_ANNOTATION_CATS)[trace.cat_id]
    idx = np.flatnonzero(on_gpu)
    del on_gpu
    if len(idx) == 0:
        return np.zeros(size, dtype=np.int64), np.zeros(size)
    launched = _launch_ids(trace)
    corr = trace.corr[idx]
    keep = member(corr, launched)
    del launched
    late = trace.corr[outside]
    late = late[late >= 0]
    if len(late):
        keep &= ~member(corr, late)
    idx = idx[keep]
    names = trace.name_id[idx]
    return np.bincount(names, minlength=size), np.bincount(names, weights=trace.dur[idx], minlength=size)


def _launch_ids(trace: Trace) -> np.ndarray:
    """Correlation ids of the CPU events (runtime calls) that launched something."""
    pieces = []
    for lo in range(0, len(trace.corr), 1 << 20):
        corr = trace.corr[lo : lo + (1 << 20)]
        pieces.append(corr[(corr >= 0) & (trace.stream[lo : lo + (1 << 20)] == -1)])
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def _rows(calls: np.ndarray, time: np.ndarray, top: int | None) -> list[tuple[int, int, float]]:
    """(name id, calls, total time) of the names called, longest total first, at most ``top``."""
    present = np.flatnonzero(calls)
    present = present[np.argsort(-time[present], kind="stable")]
    if top is not None:
        present = present[: max(top, 0)]
    return [(int(i), int(calls[i]), float(time[i])) for i in present]
