"""The step timers' model FLOPs beside a cycle's traces: what ``mfu_disagreement`` compares the
traces' counted FLOPs with.

The step timers (:mod:`torchprof_args.capture.metrics`) log, per interval, ``iteration-time`` (seconds per
iteration) and ``throughput`` (TFLOP/s per GPU: the model FLOPs of one iteration, from
``--metrics-flops-per-iteration`` or the framework's formula, over the time and the GPUs), so their
product is the formula's FLOPs per GPU and iteration.  The run's ``metrics.jsonl`` is found beside
the traces (the cycle folder, the profile folder, the run folder above it) or given.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchprof_args.analysis.beside import find_beside, read_beside, traced_cycle
from torchprof_args.naming import METRICS_FILENAME

__all__ = ["FormulaFlops", "find_metrics", "formula_beside", "formula_flops"]


@dataclass(frozen=True)
class FormulaFlops:
    """The step timers' model FLOPs of one iteration on one GPU.

    Attributes:
        flops_per_gpu: the median over the intervals used, of ``throughput`` x ``iteration-time``.
        path: the ``metrics.jsonl`` read.
        intervals: the log intervals it is the median of.
        traced: whether those are the intervals of the traced iterations (else the whole run's).
        mfu_percent: the step timers' MFU over the same intervals (None: not logged, no peak).
    """

    flops_per_gpu: float
    path: str
    intervals: int
    traced: bool
    mfu_percent: float | None = None


def find_metrics(traces: Sequence[Path], within: Sequence[str] | None = None) -> Path | None:
    """The ``metrics.jsonl`` beside ``traces`` (:func:`~.beside.find_beside`), None when there is none.

    Args:
        traces: the cycle's trace files.
        within: folders (real paths) the file must lie under (``torchprof mcp``'s roots); None: any.
    """
    return find_beside(traces, within, _metrics_in)


def _metrics_in(folder: Path) -> Path | None:
    return folder / METRICS_FILENAME if (folder / METRICS_FILENAME).is_file() else None


def formula_flops(path: Path, traces: Sequence[Path]) -> FormulaFlops | None:
    """The step timers' FLOPs per GPU and iteration from ``path`` (a ``metrics.jsonl``), over the
    intervals that cover the traced iterations (the cycle of ``traces``' folder or names) where it
    logged them, else over the whole run.

    Args:
        path: the run's ``metrics.jsonl``.
        traces: the cycle's trace files (their cycle says which iterations were traced).

    Returns:
        The :class:`FormulaFlops`; None where the file logs no ``throughput`` (no FLOPs formula).

    Raises:
        ValueError: the file is not a readable ``metrics.jsonl`` (:func:`~..shared.metrics_log.read_records`).
    """
    from torchprof_args.shared.metrics_log import read_records

    logged = [r for r in read_records(path)
              if r.metrics.get("throughput") and r.metrics.get("iteration-time")]
    if not logged:
        return None
    cycle = traced_cycle(traces)
    covering = logged
    if cycle is not None:
        first, last = cycle
        # an interval ends at its record's iteration: those ending inside the cycle, and the one after
        inside = [r for r in logged if first <= r.iteration <= last]
        after = next((r for r in logged if r.iteration > last), None)
        covering = inside + ([after] if after is not None else []) or logged
    flops = statistics.median(r.metrics["throughput"] * 1e12 * r.metrics["iteration-time"]
                              for r in covering)
    mfus = [r.metrics["mfu"] for r in covering if r.metrics.get("mfu")]
    return FormulaFlops(flops_per_gpu=flops, path=str(path), intervals=len(covering),
                        traced=covering is not logged, mfu_percent=statistics.median(mfus) if mfus else None)


def formula_beside(traces: Sequence[Path], within: Sequence[str] | None = None) -> FormulaFlops | None:
    """The step timers' FLOPs from the ``metrics.jsonl`` beside ``traces`` (:func:`find_metrics`),
    None where there is none or it cannot be read (a best effort: ``diagnose --metrics`` names a
    file and is told why it cannot be read)."""
    return read_beside(traces, within, _metrics_in, formula_flops)
