"""Every index of many short ranges at once: :func:`range_pairs`.

The graph's builders look, per query (a late kernel, a collective's run), at a short range of sorted
candidates (the kernels that ended in a window before it, a thread's intervals after it) and keep the
first or last that passes a test.  Expanding all the ranges into (query, index) pairs turns one
binary search and one small slice per query into a few array operations over all of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["PAIRS", "first_of_each", "last_of_each", "range_pairs"]

#: pairs expanded at once (bounds their memory).
PAIRS = 1 << 20


def range_pairs(lo: np.ndarray, hi: np.ndarray,
                pairs: int = PAIRS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(query, index) for every index of every range ``[lo[q], hi[q])`` (empty where ``hi <= lo``),
    in chunks of about ``pairs``: by query, then index, both ascending.

    Args:
        lo: per query, its range's first index.
        hi: per query, the end of its range.
        pairs: how many pairs a chunk holds at most (a longer range is a chunk of its own).
    """
    counts = np.maximum(np.asarray(hi, dtype=np.int64) - lo, 0)
    total = np.r_[0, np.cumsum(counts)]
    at = 0
    while at < len(counts):
        stop = max(int(np.searchsorted(total, total[at] + pairs, side="right")) - 1, at + 1)
        c = counts[at:stop]
        query = np.repeat(np.arange(at, stop), c)
        yield query, np.repeat(lo[at:stop] - (total[at:stop] - total[at]), c) + np.arange(len(query))
        at = stop


def first_of_each(query: np.ndarray) -> np.ndarray:
    """Of pairs sorted by query, where each query's first pair is."""
    return np.r_[True, query[1:] != query[:-1]] if len(query) else np.zeros(0, dtype=bool)


def last_of_each(query: np.ndarray) -> np.ndarray:
    """Of pairs sorted by query, where each query's last pair is."""
    return np.r_[query[1:] != query[:-1], True] if len(query) else np.zeros(0, dtype=bool)
