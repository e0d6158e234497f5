"""Interval algebra on sorted numpy arrays: one type, :data:`Intervals`, and what is done with it.

An :data:`Intervals` is a union of time intervals as two arrays, starts and ends (us), sorted and
disjoint, as :func:`merge_intervals` returns them (HTA's ``merge_kernel_intervals``).  Everything
here is vectorised: the analyzers apply it to millions of kernels.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "Intervals", "covered", "empty", "merge_intervals", "minus", "overlap", "subtract",
    "time_per_combination", "total",
]

#: a union of intervals: (starts, ends), sorted and disjoint (from :func:`merge_intervals`).
Intervals = tuple[np.ndarray, np.ndarray]


def empty() -> Intervals:
    """The empty union."""
    return np.zeros(0), np.zeros(0)


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> Intervals:
    """Union of intervals as HTA's ``merge_kernel_intervals`` computes it.

    Args:
        ts: the intervals' starts, in any order.
        end: their ends, in the same order.

    Returns:
        The union: sorted, disjoint starts and ends.
    """
    if len(ts) == 0:
        return ts, end
    order = np.argsort(ts, kind="stable")
    t, e = ts[order], end[order]
    new = np.empty(len(t), dtype=bool)
    new[0] = True
    new[1:] = t[1:] > np.maximum.accumulate(e)[:-1]
    idx = np.flatnonzero(new)
    return t[idx], np.maximum.reduceat(e, idx)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """The union ``a`` with the union ``b`` taken out (both from :func:`merge_intervals`)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    points = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    lo, hi = points[:-1], points[1:]
    mid = (lo + hi) / 2

    def inside(union: Intervals) -> np.ndarray:
        i = np.searchsorted(union[0], mid, side="right") - 1
        return (i >= 0) & (mid < union[1][np.maximum(i, 0)])

    keep = inside(a) & ~inside(b)
    return merge_intervals(lo[keep], hi[keep])


def total(intervals: Intervals) -> float:
    """Length (us) of a union returned by :func:`merge_intervals`."""
    starts, ends = intervals
    return float((ends - starts).sum())


def overlap(a: Intervals, b: Intervals) -> float:
    """Time (us) during which both unions are active."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    return time_per_combination({1: a, 2: b}).get(3, 0.0)


def minus(a: Intervals, b: Intervals) -> float:
    """Time (us) of ``a`` outside ``b``."""
    return total(a) - overlap(a, b)


def covered(union: Intervals, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per interval ``[a[i], b[i]]``, the time (us) ``union`` covers of it (vectorised).

    Args:
        union: from :func:`merge_intervals`.
        a: the intervals' starts.
        b: their ends.

    Returns:
        One time per interval, never negative.
    """
    starts, ends = union
    if len(starts) == 0 or len(a) == 0:
        return np.zeros(len(a))
    cum = np.r_[0.0, np.cumsum(ends - starts)]

    def upto(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, t, side="right") - 1
        j = np.maximum(i, 0)
        inside = np.clip(t - starts[j], 0.0, ends[j] - starts[j])
        return np.where(i >= 0, cum[j] + inside, 0.0)

    return np.maximum(upto(np.asarray(b, dtype=float)) - upto(np.asarray(a, dtype=float)), 0.0)


def time_per_combination(intervals: dict[int, Intervals]) -> dict[int, float]:
    """Time spent in each combination of the given interval sets, keyed by bitmask.

    ``intervals`` maps a distinct bit to a union (from :func:`merge_intervals`); the result maps
    every non-empty OR of bits to the time during which exactly those sets are active.  One sweep
    over all start/end points (HTA's algorithm): the running sum of +bit / -bit is the active
    combination.  Deltas are int8 and temporaries are dropped as soon as they are used, so a
    sweep over millions of kernels costs about 25 bytes a point.
    """
    parts = [(s, e, bit) for bit, (s, e) in intervals.items() if len(s)]
    if not parts:
        return {}
    t = np.concatenate([a for s, e, _ in parts for a in (s, e)])
    d = np.concatenate([np.full(len(a), sign * bit, dtype=np.int8)
                        for s, e, bit in parts for a, sign in ((s, 1), (e, -1))])
    order = np.argsort(t, kind="stable")
    t = t[order]
    d = d[order]
    del order
    running = np.cumsum(d, dtype=np.int8)
    del d
    seg = np.diff(t)
    del t
    state = running[:-1]
    active = state > 0
    sums = np.bincount(state[active], weights=seg[active], minlength=1)
    present = np.flatnonzero(np.bincount(state[active], minlength=1))
    return {int(value): float(sums[value]) for value in present}
