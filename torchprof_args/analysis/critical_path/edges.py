"""The edges of a rank's dependency graph as they are collected: :class:`EdgeList`, and their kinds.

Every edge says that its destination cannot happen before its source plus its *nominal* weight: the
work between them (an operator's own time on a thread, a kernel's duration), or 0 for a pure
dependency (a launch, a synchronisation, a wait).  :mod:`.graph` then gives each node's *binding*
edge (the one that made it happen when it did) the measured delay, so that the graph replays the
trace exactly.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CHAIN", "CLOCK_EPS_US", "EDGE_KINDS", "INDEX", "INFER", "ISSUE", "JOIN", "KERNEL", "LAUNCH_EDGE",
           "STREAM", "SYNC", "WAIT", "WAKE", "EdgeList"]

#: consecutive boundaries of the events on one CPU thread (the thread's own time between them).
CHAIN = 0
#: a kernel's start to its end (its duration).
KERNEL = 1
#: the previous kernel on the same stream to the next one's start.
STREAM = 2
#: a launch call's start to its kernel's start (correlation id; every kernel of a CUDA graph launch).
LAUNCH_EDGE = 3
#: the device work a blocking host call waited for, to the call's end.
SYNC = 4
#: a collective's end to the end of the host gap that waited for it (a CPU job's ``work.wait()``).
WAIT = 5
#: the c10d operator that issued a collective to gloo's span that runs it.
ISSUE = 6
#: a kernel on another stream that ended right before a kernel started (an event wait between streams).
INFER = 7
#: every rank's arrival at a matched collective to its end on each rank (cross-rank only).
JOIN = 8
#: the step's thread, just before a burst of activity on another thread began, to that burst
#: (``loss.backward()`` waking the autograd thread).
WAKE = 9
EDGE_KINDS = ("chain", "kernel", "stream", "launch", "sync", "wait", "issue", "infer", "join", "wake")


#: the dtype of node and event indices in the graph (a trace has far fewer than 2**31 events; half
#: the memory of int64 for the arrays the graph keeps per node and per edge).
INDEX = np.int32
#: how far (us) a dependency may go against the clocks before it is left out (rounding).
CLOCK_EPS_US = 1e-6


class EdgeList:
    """Edges collected in batches, concatenated once, column by column.

    Every batch is checked against the node times ``t`` as it is added: an edge whose destination
    happened before its source plus its nominal weight (a dependency against the clocks) is left out
    there, so no uncut copy of all the edges is ever made.  Indices are kept as :data:`INDEX`.  A
    batch's arrays may be kept as they are until :meth:`arrays`: the caller does not change them.
    """

    def __init__(self, t: np.ndarray) -> None:
        self._t = t
        self._parts: list[list[np.ndarray]] = [[] for _ in range(7)]

    def add(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | float, kind: int,
            category: np.ndarray | int, owner: np.ndarray, flag: np.ndarray | bool = False) -> None:
        """Add ``len(src)`` edges of one kind (those that agree with the clocks).

        Args:
            src: source nodes.
            dst: destination nodes.
            weight: nominal weights (us).
            kind: one of the module's kinds.
            category: the category (:mod:`.categories`) of the time the edge carries.
            owner: the event the edge's time is attributed to (-1: none).
            flag: a kind-specific mark (a wait on a collective issued at the step's top level).
        """
        n = len(src)
        if n == 0:
            return
        w = np.broadcast_to(np.asarray(weight, dtype=np.float64), (n,))
        good = self._t[src] + w <= self._t[dst] + CLOCK_EPS_US
        ok = None if good.all() else np.flatnonzero(good)  # None: all of them (no copy to select them)
        del good
        if ok is not None and not len(ok):
            return

        def kept(values: np.ndarray | float | bool, dtype: type) -> np.ndarray:
            """The edges' column: the caller's array itself where every edge is kept and its dtype is
            the column's (concatenated by :meth:`arrays`, not copied here)."""
            column: np.ndarray = np.broadcast_to(np.asarray(values, dtype=dtype), (n,))
            column = column if ok is None else column[ok]
            return column.copy() if column.strides == (0,) else column

        columns = (kept(src, INDEX), kept(dst, INDEX), kept(w, np.float64),
                   np.full(n if ok is None else len(ok), kind, dtype=np.int8),
                   kept(category, np.int8), kept(owner, INDEX), kept(flag, bool))
        for parts, column in zip(self._parts, columns, strict=True):
            parts.append(column)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(src, dst, weight, kind, category, owner, flag), every edge kept; the batches are released
        column by column (the list is empty afterwards)."""
        dtypes = (INDEX, INDEX, np.float64, np.int8, np.int8, INDEX, bool)
        out = []
        for parts, dtype in zip(self._parts, dtypes, strict=True):
            out.append(np.concatenate(parts) if parts else np.zeros(0, dtype=dtype))
            parts.clear()
        return tuple(out)
