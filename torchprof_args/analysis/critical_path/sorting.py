"""A faster stable order of integer keys, for the sorts the graph's builder and its reduction make of
millions of node, edge and walk indices (numpy's stable sort of int64 is a timsort)."""

from __future__ import annotations

import numpy as np

__all__ = ["stable_order"]

_RADIX_SPAN = 1 << 16
_PACKED_LIMIT = 1 << 62


def stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for integer keys in no particular order, 2-4x faster.

    Keys within 65,536 values are sorted as 16-bit keys (numpy's radix sort, linear); others as
    (key, position) pairs packed into one int64 where they fit, by numpy's unstable sort (no two
    pairs are equal, so the order is the stable one).  Keys already nearly sorted are better left to
    ``np.argsort(kind="stable")``, which is linear on them.

    Args:
        keys: a 1-D integer array.

    Returns:
        The int64 positions that sort ``keys``, equal keys in their order of position.
    """
    n = len(keys)
    if n < 2:
        return np.argsort(keys, kind="stable")
    low, high = int(keys.min()), int(keys.max())
    span = high - low + 1
    if span <= _RADIX_SPAN:
        return np.argsort((keys - low).astype(np.uint16), kind="stable")
    if span * n >= _PACKED_LIMIT:
        return np.argsort(keys, kind="stable")
    return np.argsort((keys.astype(np.int64) - low) * n + np.arange(n, dtype=np.int64))
