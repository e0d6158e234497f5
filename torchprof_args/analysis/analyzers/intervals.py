"""Interval algebra on sorted numpy arrays: unions, and time spent in each overlap combination."""

from __future__ import annotations

import numpy as np

__all__ = ["merge_intervals", "time_per_combination", "total"]


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


def total(intervals: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of a union returned by :func:`merge_intervals`."""
    starts, ends = intervals
    return float((ends - starts).sum())


def time_per_combination(intervals: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, float]:
    """Time spent in each combination of the given interval sets, keyed by bitmask.

    ``intervals`` maps a distinct bit to a union (from :func:`merge_intervals`); the result maps
    every non-empty OR of bits to the time during which exactly those sets are active.  One sweep
    over all start/end points: the running sum of +bit / -bit is the active combination.
    """
    times, deltas = [], []
    for bit, (s, e) in intervals.items():
        times += [s, e]
        deltas += [np.full(len(s), bit, dtype=np.int64), np.full(len(e), -bit, dtype=np.int64)]
    if not times:
        return {}
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    order = np.argsort(t, kind="stable")
    t, running = t[order], np.cumsum(d[order])
    seg = np.diff(t)
    state = running[:-1]
    out: dict[int, float] = {}
    for value in np.unique(state):
        if value > 0:
            out[int(value)] = float(seg[state == value].sum())
    return out
