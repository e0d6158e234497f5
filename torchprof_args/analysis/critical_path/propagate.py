"""Replaying a rank's graph: each node's time from its sources, with the two best *labels*.

A replay computes, in topological order, ``t(v) = max over edges u -> v of t(u) + weight``.  Some
nodes are *labels*, where the replay starts afresh: the window's start and everything before it
(label :data:`WINDOW`), a node with no incoming edge (it keeps its measured time, also label
:data:`WINDOW`: the window's start never moves), the completion of every collective (label: the
collective's record index), whose time comes from the other ranks (:mod:`.cycle`), and the end of
every step (label :func:`step_label`), which is computed like any node first (it is a *sink*) and
then starts afresh, so that every path between labels lies within a step or two.  Each node keeps
the best time reachable from each of its two best distinct labels, and the edge that gave its best:
so a sink's time is known as a function of the labels before it (``max(t(label1) + d1, t(label2) +
d2)``), which is all the cross-rank replay needs of the rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.edges import WAIT
from torchprof_args.analysis.critical_path.graph import LocalGraph
from torchprof_args.analysis.critical_path.replay_kernel import NONE, WINDOW, compiled, kernel

__all__ = ["NONE", "WINDOW", "WORK", "Replay", "Value", "replay", "step_label", "step_of_label"]

#: the categories of a rank's own work (what a slow rank has more of): not communication, waiting
#: or host synchronisation.
WORK = (cat.COMPUTE, cat.LAUNCH, cat.DATA_LOADER, cat.CPU_ONLY, cat.MEMCPY)


def step_label(step: int) -> int:
    """The label of step ``step``'s end (steps are numbered from 0)."""
    return -3 - step


def step_of_label(label: int) -> int | None:
    """The step whose end ``label`` is, None for another label."""
    return -3 - label if label <= -3 else None


#: a node's value in a replay: (label1, time1, work1, label2, time2, work2, via); ``work``: the time
#: of work edges (:data:`WORK`) on the best path from the label.
Value = tuple[int, float, float, int, float, float, int]


@dataclass
class Replay:
    """One replay: per node its best and second-best (label, time, work) and the edge of its best
    (-1 at a label: a walk back along ``via`` stops there), arrays by node; ``sinks``: the step ends'
    own values, before they start afresh."""

    label1: np.ndarray
    time1: np.ndarray
    work1: np.ndarray
    label2: np.ndarray
    time2: np.ndarray
    work2: np.ndarray
    via: np.ndarray
    sinks: dict[int, Value]

    def value(self, node: int) -> Value:
        """(label1, time1, work1, label2, time2, work2, via) of ``node`` as a sink (Python numbers)."""
        found = self.sinks.get(node)
        if found is not None:
            return found
        return (int(self.label1[node]), float(self.time1[node]), float(self.work1[node]),
                int(self.label2[node]), float(self.time2[node]), float(self.work2[node]), int(self.via[node]))


def fixed_labels(graph: LocalGraph) -> dict[int, int]:
    """Node -> label of every fixed node that is not fixed by being early or a source: the
    collectives' completions (and the end of gloo's span of one whose waiter resumed first)."""
    out = {int(node): i for i, node in enumerate(graph.completion.tolist()) if node >= 0}
    out.update({span_end: out[node] for node, span_end in graph.early.items() if node in out})
    return out


def replay(graph: LocalGraph, weight: np.ndarray | None = None, cut: np.ndarray | None = None,
           work: np.ndarray | None = None) -> Replay:
    """Replay ``graph`` with ``weight`` (default: its own) and without the edges ``cut`` marks.

    Args:
        graph: the rank's graph.
        weight: per edge, its weight in this replay.
        cut: per edge, whether it is left out (a dependency a what-if removes).
        work: per edge, how much of its weight is the rank's own work (default: all of it for the
            :data:`WORK` categories, none for the others).

    Returns:
        The :class:`Replay`.
    """
    n = len(graph.t)
    weights = graph.weight if weight is None else weight
    ptr = graph.in_ptr
    in_edges = graph.in_edges if cut is None else graph.in_edges[~cut[graph.in_edges]]
    if cut is not None:  # the pointers of the edges kept
        kept = np.zeros(len(graph.src), dtype=np.int64)
        kept[graph.in_edges[~cut[graph.in_edges]]] = 1
        counts = np.bincount(graph.dst, weights=kept, minlength=n).astype(np.int64)
        ptr = np.r_[0, np.cumsum(counts)]
    start = graph.t[graph.window_node] if graph.window_node >= 0 else -np.inf
    fixed = fixed_labels(graph)
    if cut is not None:  # a completion where a waiting thread resumed is free once the wait is cut
        for node, span_end in graph.early.items():
            ins_of = graph.in_edges[graph.in_ptr[node]:graph.in_ptr[node + 1]]
            if any(cut[e] for e in ins_of.tolist() if graph.kind[e] == WAIT):
                fixed.pop(node, None)
                fixed.pop(span_end, None)
    # per node: a label it starts afresh with (fixed, else NONE); a step end restarts with its label
    start_label = np.full(n, NONE, dtype=np.int64)
    start_label[np.fromiter(fixed, np.int64, len(fixed))] = np.fromiter(fixed.values(), np.int64, len(fixed))
    ends = np.array([s.end for s in graph.steps], dtype=np.int64)
    restart = np.full(n, -1, dtype=np.int64)
    restart[ends] = np.arange(len(ends))
    done_by = np.where(np.isin(graph.category, WORK), weights, 0.0) if work is None else work
    flat = np.ascontiguousarray  # a copy only where the dtype differs or the array is a strided view
    inputs = (flat(graph.order, dtype=np.int64), flat(ptr, dtype=np.int64),
              flat(in_edges, dtype=np.int64), flat(graph.src, dtype=np.int64),
              flat(weights, dtype=np.float64), flat(done_by, dtype=np.float64),
              start_label, graph.t <= start, restart, flat(graph.t, dtype=np.float64))
    out = [*_slots(n), *_slots(len(ends))]  # per node, then per step end as a sink
    fast = compiled(len(in_edges))
    if fast is not None:
        fast(*inputs, *out)
    else:  # the same kernel over lists: each element access a list's, not a numpy scalar's
        lists: list[Any] = [x.tolist() for x in out]
        kernel(*(x.tolist() for x in inputs), *lists)
        out = [np.asarray(x, dtype=y.dtype) for x, y in zip(lists, out, strict=True)]
    sink = list(zip(*(x.tolist() for x in out[7:]), strict=True))
    sinks: dict[int, Value] = {v: sink[k] for k, v in enumerate(ends.tolist()) if sink[k][0] != NONE}
    labels1, times1, works1, labels2, times2, works2, via = out[:7]
    return Replay(labels1, times1, works1, labels2, times2, works2, via, sinks)


def _slots(n: int) -> list[np.ndarray]:
    """(label1, time1, work1, label2, time2, work2, via) for ``n`` values, as nothing has reached them."""
    return [np.full(n, NONE, np.int64), np.full(n, -np.inf), np.zeros(n), np.full(n, NONE, np.int64),
            np.full(n, -np.inf), np.zeros(n), np.full(n, -1, np.int64)]
