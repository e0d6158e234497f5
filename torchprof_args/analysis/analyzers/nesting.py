"""Which event of a set encloses a moment: the innermost, for many moments at once.

The memory trace path (:mod:`..memory.trace_memory`) asks, for every ``[memory]`` event, for the innermost
operator, module and Python frame of its thread around it, and :func:`.callsites.call_sites` for
the innermost Python frame around an event.  Events of one thread nest, so the
innermost enclosing event of a moment is the latest-starting one that starts before it, or, when
that one has already ended, its closest ancestor that has not: found for all moments at once by
climbing parent links (computed once, one pass over the set).
"""

from __future__ import annotations

import numpy as np

__all__ = ["Nesting"]


class Nesting:
    """Properly nested intervals (one thread's events), queried for the innermost around moments.

    Args:
        starts: the intervals' starts.
        ends: their ends (``start + dur``).
    """

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        order = np.lexsort((-ends, starts))  # by start, the longest first at equal starts
        self.order = order
        self.starts = starts[order]
        self.ends = ends[order]
        self.parent = self._parents()
        self._position = np.empty(len(order), dtype=np.int64)
        self._position[order] = np.arange(len(order))

    def _parents(self) -> np.ndarray:
        """Each interval's closest enclosing one (-1: none), level by level, no per-interval loop.

        An interval's depth is the number of intervals before it (in start order) not yet ended at
        its start (an end equal to the start still encloses it); its parent is the closest earlier
        interval one level up."""
        n = len(self.starts)
        parent = np.full(n, -1, dtype=np.int64)
        if not n:
            return parent
        depth = np.arange(n) - np.searchsorted(np.sort(self.ends, kind="stable"), self.starts, side="left")
        np.maximum(depth, 0, out=depth)
        by_depth = np.argsort(depth, kind="stable")
        first = np.searchsorted(depth[by_depth], np.arange(int(depth.max()) + 2))
        for level in range(1, len(first) - 1):
            members = by_depth[first[level]:first[level + 1]]
            above = by_depth[first[level - 1]:first[level]]
            if not len(members) or not len(above):
                continue
            cand = above[np.maximum(np.searchsorted(above, members) - 1, 0)]
            ok = cand < members
            parent[members[ok]] = cand[ok]
        return parent

    def innermost(self, moments: np.ndarray) -> np.ndarray:
        """For each moment, the index (into the arrays given) of the innermost interval around it,
        -1 where none is."""
        if not len(self.starts) or not len(moments):
            return np.full(len(moments), -1, dtype=np.int64)
        found = np.searchsorted(self.starts, moments, side="right") - 1
        todo = np.flatnonzero(found >= 0)
        while len(todo):
            ended = self.ends[found[todo]] < moments[todo]
            todo = todo[ended]
            found[todo] = self.parent[found[todo]]
            todo = todo[found[todo] >= 0]
        return np.where(found >= 0, self.order[np.maximum(found, 0)], -1)

    def chain(self, index: int) -> list[int]:
        """Interval ``index`` (into the arrays given) and its ancestors, innermost first."""
        position = int(self._position[index])
        out = []
        while position >= 0:
            out.append(int(self.order[position]))
            position = int(self.parent[position])
        return out

    def inside(self, moments: np.ndarray) -> np.ndarray:
        """Whether each moment lies inside any interval."""
        return self.innermost(moments) >= 0
