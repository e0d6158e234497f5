"""Selecting events by their interned ids without touching each event in Python.

A trace stores names, categories and threads once each and gives every event small integer ids
into those tables, so "events whose name matches" is a boolean table over the distinct names,
indexed by the events' ids: one Python test per distinct name, then one numpy gather.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

__all__ = ["distinct", "lookup", "member"]


def lookup(table: list[str], wanted: Collection[str] | Callable[[str], object]) -> np.ndarray:
    """Boolean table indexed by id: ``lookup(trace.names, pred)[trace.name_id]`` is a mask.

    Cheaper than ``np.isin`` on millions of ids (no sort, no temporaries).  ``wanted`` is a
    collection of strings or a predicate.  The extra last entry (False) keeps an empty table
    indexable.
    """
    test = wanted if callable(wanted) else wanted.__contains__
    return np.array([bool(test(x)) for x in table] + [False], dtype=bool)


def member(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``np.isin(values, wanted)`` for integers, through a bitmap when their range is compact."""
    if len(values) == 0 or len(wanted) == 0:
        return np.zeros(len(values), dtype=bool)
    lo = int(min(values.min(), wanted.min()))
    hi = int(max(values.max(), wanted.max()))
    if hi - lo > 8 * (len(values) + len(wanted)) + (1 << 20):
        # Sparse ids: binary search in the sorted wanted set (np.isin would sort both arrays
        # together, several temporaries of their combined size).
        table = distinct(wanted)
        pos = np.searchsorted(table, values)
        np.minimum(pos, len(table) - 1, out=pos)
        return table[pos] == values
    bitmap = np.zeros(hi - lo + 1, dtype=bool)
    bitmap[wanted - lo if lo else wanted] = True
    return bitmap[values - lo] if lo else bitmap[values]


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values: ``np.unique`` for arrays with many distinct values, which
    numpy 2 answers much more slowly (hashing) than a sort and a comparison of neighbours."""
    values = np.sort(values)
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]
