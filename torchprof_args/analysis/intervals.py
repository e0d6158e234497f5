"""Interval algebra on sorted numpy arrays: unions, and time spent in each overlap combination."""

from __future__ import annotations

import numpy as np

__all__ = ["merge_intervals", "subtract", "time_per_combination", "total"]


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as HTA's ``merge_kernel_intervals`` computes it (sorted starts/ends)."""
    if len(ts) == 0:
        return ts, end
    order = np.argsort(ts, kind="stable")
    t, e = ts[order], end[order]
    new = np.empty(len(t), dtype=bool)
    new[0] = True
    new[1:] = t[1:] > np.maximum.accumulate(e)[:-1]
    idx = np.flatnonzero(new)
    return t[idx], np.maximum.reduceat(e, idx)


Union = tuple[np.ndarray, np.ndarray]


def subtract(a: Union, b: Union) -> Union:
    """The union ``a`` with the union ``b`` taken out (both from :func:`merge_intervals`)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    points = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    lo, hi = points[:-1], points[1:]
    mid = (lo + hi) / 2

    def inside(union: Union) -> np.ndarray:
        i = np.searchsorted(union[0], mid, side="right") - 1
        return (i >= 0) & (mid < union[1][np.maximum(i, 0)])

    keep = inside(a) & ~inside(b)
    return merge_intervals(lo[keep], hi[keep])


def total(intervals: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of a union returned by :func:`merge_intervals`."""
    starts, ends = intervals
    return float((ends - starts).sum())


def time_per_combination(intervals: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, float]:
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
