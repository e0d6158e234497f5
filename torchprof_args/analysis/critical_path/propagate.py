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

import numpy as np

from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.edges import WAIT
from torchprof_args.analysis.critical_path.graph import LocalGraph

__all__ = ["NONE", "WINDOW", "WORK", "Replay", "Value", "replay", "step_label", "step_of_label"]

#: the label of the window's start (the first step's start: fixed, never moves).
WINDOW = -1
#: no label (a node nothing reaches).
NONE = -2
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
    (-1 at a label: a walk back along ``via`` stops there); ``sinks``: the step ends' own values,
    before they start afresh."""

    label1: list[int]
    time1: list[float]
    work1: list[float]
    label2: list[int]
    time2: list[float]
    work2: list[float]
    via: list[int]
    sinks: dict[int, Value]

    def value(self, node: int) -> Value:
        """(label1, time1, work1, label2, time2, work2, via) of ``node`` as a sink."""
        found = self.sinks.get(node)
        if found is not None:
            return found
        return (self.label1[node], self.time1[node], self.work1[node], self.label2[node], self.time2[node],
                self.work2[node], self.via[node])


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
    w = weights.tolist()
    src = graph.src.tolist()
    ptr = graph.in_ptr.tolist()
    in_edges = graph.in_edges if cut is None else graph.in_edges[~cut[graph.in_edges]]
    if cut is not None:  # the pointers of the edges kept
        kept = np.zeros(len(graph.src), dtype=np.int64)
        kept[graph.in_edges[~cut[graph.in_edges]]] = 1
        counts = np.bincount(graph.dst, weights=kept, minlength=n).astype(np.int64)
        ptr = np.r_[0, np.cumsum(counts)].tolist()
    ins = in_edges.tolist()
    t = graph.t.tolist()
    start = t[graph.window_node] if graph.window_node >= 0 else -np.inf
    fixed = fixed_labels(graph)
    if cut is not None:  # a completion where a waiting thread resumed is free once the wait is cut
        for node, span_end in graph.early.items():
            ins_of = graph.in_edges[graph.in_ptr[node]:graph.in_ptr[node + 1]]
            if any(cut[e] for e in ins_of.tolist() if graph.kind[e] == WAIT):
                fixed.pop(node, None)
                fixed.pop(span_end, None)
    # per node: a label it starts afresh with (fixed), else None; whether it keeps its measured time
    start_label: list[int | None] = [None] * n
    for node, label in fixed.items():
        start_label[node] = label
    early = (graph.t <= start).tolist()
    restart = {s.end: step_label(i) for i, s in enumerate(graph.steps)}
    done_by = (np.where(np.isin(graph.category, WORK), weights, 0.0) if work is None else work).tolist()
    sinks: dict[int, Value] = {}
    l1, t1, w1 = [NONE] * n, [-np.inf] * n, [0.0] * n
    l2, t2, w2 = [NONE] * n, [-np.inf] * n, [0.0] * n
    via = [-1] * n
    minus_inf = -np.inf
    for v in graph.order.tolist():
        label = start_label[v]
        if label is not None:
            l1[v], t1[v] = label, t[v]
            continue
        a, b = ptr[v], ptr[v + 1]
        if early[v] or a == b:
            l1[v], t1[v] = WINDOW, t[v]
            continue
        bl, bt, bw, sl, st, sw, be = NONE, minus_inf, 0.0, NONE, minus_inf, 0.0, -1
        for e in ins[a:b]:
            u = src[e]
            we = w[e]
            done = done_by[e]
            lx, x = l1[u], t1[u] + we
            if x > bt:  # the best slot of u (never NONE: every node visited has one)
                if lx != bl:
                    sl, st, sw = bl, bt, bw
                bl, bt, bw, be = lx, x, w1[u] + done, e
            elif lx != bl and x > st:
                sl, st, sw = lx, x, w1[u] + done
            lx = l2[u]
            if lx != NONE:
                x = t2[u] + we
                if x > bt:
                    if lx != bl:
                        sl, st, sw = bl, bt, bw
                    bl, bt, bw, be = lx, x, w2[u] + done, e
                elif lx != bl and x > st:
                    sl, st, sw = lx, x, w2[u] + done
        if bl == NONE:  # every edge in was cut: the node keeps its measured time
            bl, bt = WINDOW, t[v]
        again = restart.get(v)
        if again is not None:
            sinks[v] = (bl, bt, bw, sl, st, sw, be)
            bl, bt, bw, sl, st, sw, be = again, t[v], 0.0, NONE, minus_inf, 0.0, -1
        l1[v], t1[v], w1[v], l2[v], t2[v], w2[v], via[v] = bl, bt, bw, sl, st, sw, be
    return Replay(l1, t1, w1, l2, t2, w2, via, sinks)
