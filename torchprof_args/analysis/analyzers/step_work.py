"""A rank's work per step: the step's time less the time it spent in collectives.

In a synchronous job every rank's step lasts about as long as the slowest rank's: the others wait for
it inside the step's collectives, so step times cannot name the slow rank, and its work can.  This
is the figure the straggler rule (:mod:`torchprof_args.shared.stragglers`) scores: ``summary``'s
cross-rank view and ``diagnose`` (its rank part) both take it from here, over the same collective
instances (:func:`~torchprof_args.analysis.analyzers.collectives.collective_spans`); ``diagnose``
refines it with the matched collectives' waits where it has them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.collectives import collective_spans
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.intervals import merge_intervals, total
from torchprof_args.analysis.trace import StepSpan, Trace

__all__ = ["WORK_IN_WORDS", "StepWork", "mean_work_us", "step_work", "trace_step_work"]

#: the figure in words, where a view ranks or scores ranks by it.
WORK_IN_WORDS = "work (the mean step less the time in collectives)"


class StepWork(msgspec.Struct, frozen=True):
    """One step of a rank (us, trace-relative): its time in collectives and the rest, its work."""

    name: str
    start_us: float
    dur_us: float
    collective_us: float
    work_us: float


def step_work(step_spans: Sequence[StepSpan], starts: np.ndarray, ends: np.ndarray) -> list[StepWork]:
    """Per step: its duration, its time in collectives and the difference, its work.

    Args:
        step_spans: :func:`~torchprof_args.analysis.analyzers.steps.steps` rows (trace-relative).
        starts, ends: the collective instances' intervals (trace-relative us); overlapping ones (DDP's
            buckets) count once.

    Returns:
        One :class:`StepWork` per step, in order.
    """
    out = []
    for step in step_spans:
        lo, hi = step["start_us"], step["start_us"] + step["dur_us"]
        inside = (ends > lo) & (starts < hi)
        union = merge_intervals(np.maximum(starts[inside], lo), np.minimum(ends[inside], hi))
        comm = total(union) if inside.any() else 0.0
        out.append(StepWork(name=step["name"], start_us=lo, dur_us=step["dur_us"], collective_us=comm,
                            work_us=max(step["dur_us"] - comm, 0.0)))
    return out


def trace_step_work(trace: Trace) -> list[StepWork]:
    """:func:`step_work` of a trace's steps over its own collective instances (no side table needed)."""
    return step_work(steps(trace), *collective_spans(trace))


def mean_work_us(work: Sequence[StepWork]) -> float | None:
    """The mean work per step (None without steps)."""
    return statistics.fmean(s.work_us for s in work) if work else None
