"""Communication/computation overlap, with HTA's definition.

The share of the time communication kernels run during which a computation kernel runs too:
``|union(comm) ∩ union(comp)| / |union(comm)|``.  Kernels are selected, rounded and classified
by :mod:`.gpu` (HTA's rules); this module only measures their unions.  It is apart from the GPU
breakdown because it answers a different question (is communication hidden behind compute?) and
is read on its own, per rank, to find ranks whose communication is exposed.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np

from torchprof_args.analysis.intervals import time_per_combination, total

__all__ = ["CommCompOverlap", "comm_comp_overlap"]


class CommCompOverlap(TypedDict):
    """Communication time and the part of it computation overlaps (part of :class:`.gpu.GpuBreakdown`)."""

    communication_us: float
    comm_comp_overlap_us: int | float
    comm_comp_overlap_pct: float | None


def comm_comp_overlap(
    communication: tuple[np.ndarray, np.ndarray], computation: tuple[np.ndarray, np.ndarray],
    both: float | None = None,
) -> CommCompOverlap:
    """Communication time, the part of it overlapped by computation (us), and that part in %.

    Arguments are unions from :func:`~.intervals.merge_intervals`; ``both``, when the caller has
    it from a sweep of its own, is the time both run.  The percentage is None when there is no
    communication.
    """
    comm_total = total(communication)
    if both is None:
        both = time_per_combination({1: communication, 2: computation}).get(3, 0.0)
    return {
        "communication_us": comm_total,
        "comm_comp_overlap_us": both,
        "comm_comp_overlap_pct": 100.0 * both / comm_total if comm_total > 0 else None,
    }
