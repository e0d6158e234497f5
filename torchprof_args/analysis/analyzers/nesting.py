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

from torchprof_args.analysis.trace import Trace

__all__ = ["Nesting", "enclosing"]


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


def enclosing(trace: Trace, idx: np.ndarray, candidates: np.ndarray,
              preferred: np.ndarray | None = None) -> np.ndarray:
    """Per event of ``idx``, the innermost event of ``candidates`` on its thread that encloses it
    whole (-1 where none does); with ``preferred`` (a bool per name id), the innermost enclosing
    one whose name is preferred, else the innermost.

    Args:
        trace: the trace the indices point into.
        idx: the events asked about.
        candidates: the events that may enclose them (properly nested per thread: Python frames,
            ``nn.Module`` events, operators).
        preferred: which names to prefer (a user's frame over a library's), or None.

    Returns:
        An index into the trace per event of ``idx``, or -1."""
    idx = np.asarray(idx, dtype=np.int64)
    out = np.full(len(idx), -1, dtype=np.int64)
    if not len(candidates) or not len(idx):
        return out
    c_thread, q_thread = trace.thread_id[candidates], trace.thread_id[idx]
    for thread in np.unique(q_thread).tolist():
        mine = candidates[c_thread == thread]
        if not len(mine):
            continue
        c_end = trace.ts[mine] + trace.dur[mine]
        nest = Nesting(trace.ts[mine], c_end)
        asked = np.flatnonzero(q_thread == thread)
        ends = (trace.ts[idx[asked]] + trace.dur[idx[asked]]).tolist()
        for q, found, end in zip(asked.tolist(), nest.innermost(trace.ts[idx[asked]]).tolist(), ends,
                                 strict=True):
            # the chain is innermost first
            around = [c for c in nest.chain(found) if c_end[c] >= end] if found >= 0 else []
            if not around:
                continue
            best = around[0] if preferred is None else next(
                (c for c in around if preferred[trace.name_id[mine[c]]]), around[0])
            out[q] = mine[best]
    return out
