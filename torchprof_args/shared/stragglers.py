"""Stragglers: the one definition of a slow rank, for the step timers (``metrics/``: scores, the
dashboard's heatmap, rank 0's warning) and the trace tools (``analysis/``: ``torchprof summary``'s
cross-rank view, ``diagnose``'s ``straggler``).

* A rank's **straggler score** for a figure is its value over the median of the *other* ranks'
  values (with two ranks the median of all is the mean of both, which hides half the excess).
* A rank **is a straggler** when its score reaches :data:`STRAGGLER_THRESHOLD` (``1.05``;
  ``--straggler-threshold`` for the timers' warning) and its value exceeds the others' median by
  :data:`STRAGGLER_MIN_MS` (2 ms) or more.
* The figure is the rank's own *work*: in a synchronous job every rank's step lasts as long as the
  slowest rank's (the others wait in the collectives).  ``summary``: the mean step less the rank's
  time in collectives (``analysis/analyzers/step_work.py``); ``diagnose``: the same, less only the
  time waited for the last rank where it matched the collectives across ranks; a step timer: its
  reading (the rank's own work where it holds no collective).

No import of torch or numpy: the training process imports it with the timers.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["STRAGGLER_MIN_MS", "STRAGGLER_THRESHOLD", "describe", "is_straggler", "others_medians",
           "straggler_score"]

#: a straggler's score reaches this (its figure over the median of the other ranks').
STRAGGLER_THRESHOLD = 1.05
#: and its figure exceeds that median by this many milliseconds.
STRAGGLER_MIN_MS = 2.0


def others_medians(values: Sequence[float]) -> list[float]:
    """For each of ``values`` (two or more), the median of the others: one sort, O(n log n)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranked = [values[i] for i in order]
    half, odd = divmod(len(values) - 1, 2)
    out = [0.0] * len(values)
    for place, i in enumerate(order):  # the others: ``ranked`` without ``place``
        low, high = (ranked[k if k < place else k + 1] for k in (half - 1 + odd, half))
        out[i] = (low + high) / 2
    return out


def straggler_score(value: float, others_median: float) -> float | None:
    """``value`` over the median of the other ranks' (None when that median is not positive)."""
    return value / others_median if others_median > 0 else None


def is_straggler(value_ms: float, others_median_ms: float, threshold: float = STRAGGLER_THRESHOLD,
                 min_ms: float = STRAGGLER_MIN_MS) -> bool:
    """Whether a rank whose figure is ``value_ms`` is a straggler beside the others' median."""
    return value_ms >= threshold * others_median_ms and value_ms - others_median_ms >= min_ms


def describe(figure: str, threshold: float = STRAGGLER_THRESHOLD, min_ms: float = STRAGGLER_MIN_MS) -> str:
    """The rule in words, e.g. ``work >= 1.05x the other ranks' median and 2 ms over it``."""
    return f"{figure} >= {threshold:g}x the other ranks' median and {min_ms:g} ms over it"
