"""A rank's graph with its plain chains contracted, for the what-if replays (:class:`Contracted`).

Most nodes of a rank's graph (80 % on real GPU traces, 99 % on CPU jobs) sit inside a thread's chain
with one edge in and one edge out: the boundaries of operators that launch nothing and wait for
nothing.  A replay through them only adds weights, so each run of them is replaced by one edge whose
weight is the run's sum (its work the run's work, cut when any of it is), recomputed per what-if by
``np.add.reduceat``: the replay (:func:`~.propagate.replay`) then visits a fifth of the nodes and
gives every kept node (every label and sink among them) the time the full graph would.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from torchprof_args.analysis.critical_path.edges import CHAIN
from torchprof_args.analysis.critical_path.graph import LocalGraph, StepNodes
from torchprof_args.analysis.critical_path.propagate import WORK

__all__ = ["Contracted", "contract"]


@dataclass
class Contracted:
    """The contracted graph (a :class:`~.graph.LocalGraph` over the kept nodes) and how to carry a
    what-if's per-edge arrays of the full graph over to it."""

    graph: LocalGraph
    #: the full graph's edges, grouped: each contracted edge's run is ``members[starts[i]:starts[i+1]]``;
    #: None where every run is already a range of edge indices (the graph's edges in its builder's
    #: order: a thread's chain edges one after the other): ``members`` is then the identity.
    members: np.ndarray | None
    starts: np.ndarray

    def member_edges(self, at: np.ndarray) -> np.ndarray:
        """The full graph's edges at positions ``at`` of the grouped order."""
        return at if self.members is None else self.members[at]

    def _grouped(self, values: np.ndarray) -> np.ndarray:
        return values if self.members is None else values[self.members]

    def weights(self, weight: np.ndarray) -> np.ndarray:
        """A full graph's edge weights, summed over each contracted edge's run."""
        return np.add.reduceat(self._grouped(weight), self.starts[:-1]) if len(weight) else weight[:0]

    def cuts(self, cut: np.ndarray) -> np.ndarray:
        """A full graph's cut edges: a contracted edge is cut when any edge of its run is."""
        return np.maximum.reduceat(self._grouped(cut), self.starts[:-1]) if len(cut) else cut[:0]

    def work(self, weight: np.ndarray, full: LocalGraph) -> np.ndarray:
        """The work (:data:`~.propagate.WORK`) of each contracted edge's run, with ``weight``."""
        return self.weights(np.where(np.isin(full.category, WORK), weight, 0.0))


def _kept(graph: LocalGraph) -> np.ndarray:
    """The nodes a replay must visit: all but the plain chain interiors."""
    n = len(graph.t)
    chain = graph.kind == CHAIN
    ins = np.bincount(graph.dst, minlength=n)
    outs = np.bincount(graph.src, minlength=n)
    chain_in = np.zeros(n, dtype=bool)
    chain_in[graph.dst[chain]] = True
    chain_out = np.zeros(n, dtype=bool)
    chain_out[graph.src[chain]] = True
    kept = ~((ins == 1) & (outs == 1) & chain_in & chain_out)
    special = [graph.window_node, *graph.completion.tolist(), *graph.arrival.tolist(), *graph.early,
               *graph.early.values(), *(s.start for s in graph.steps), *(s.end for s in graph.steps)]
    kept[[v for v in special if v >= 0]] = True
    return kept


def _runs(graph: LocalGraph, kept: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The edges run by run (``member``; run ``r`` is ``member[first[r]:first[r + 1]]``, from its head,
    an edge out of a kept node, through the removed nodes), runs in their heads' order.

    The builder adds a thread's chain edges one after the other, so every edge out of a removed node
    follows the edge into it: each run is a range of edge indices, ``member`` the identity (None),
    checked in one pass.  Otherwise each edge's head and place in its run by pointer jumping (list
    ranking: ~log2 of the longest run passes of array operations, no walk edge by edge)."""
    n_edges = len(graph.src)
    is_head = kept[graph.src]
    into = np.full(len(graph.t), -1, dtype=np.int64)
    ends_removed = ~kept[graph.dst]
    into[graph.dst[ends_removed]] = np.flatnonzero(ends_removed)  # a removed node's one edge in
    follows = np.flatnonzero(~is_head)
    if not len(follows) or bool((into[graph.src[follows]] == follows - 1).all()):
        first = np.r_[np.flatnonzero(is_head), n_edges].astype(np.int64)
        if not n_edges or first[0] == 0:
            return None, first
    up = np.where(is_head, np.arange(n_edges), into[graph.src])
    rank = (~is_head).astype(np.int64)
    for _ in range(64):
        further = up[up]
        if np.array_equal(further, up):
            break
        rank += rank[up]
        up = further
    else:
        raise AssertionError("a run of removed nodes without a head")
    heads = np.flatnonzero(is_head)
    run_of = np.searchsorted(heads, up)
    member = np.lexsort((rank, run_of)).astype(np.int64)
    first = np.zeros(len(heads) + 1, dtype=np.int64)
    np.cumsum(np.bincount(run_of, minlength=len(heads)), out=first[1:])
    return member, first


def contract(graph: LocalGraph) -> Contracted:
    """``graph`` with its plain chain runs contracted (see the module's docstring)."""
    kept = _kept(graph)
    n_edges = len(graph.src)
    member, first = _runs(graph, kept)
    grouped = np.arange(n_edges) if member is None else member
    tails = grouped[first[1:] - 1] if n_edges else grouped
    heads = grouped[first[:-1]]
    del grouped
    new_id = np.cumsum(kept) - 1
    src, dst = new_id[graph.src[heads]], new_id[graph.dst[tails]]
    t = graph.t[kept]
    m = len(heads)
    single = first[1:] - first[:-1] == 1
    kind = np.where(single, graph.kind[heads], CHAIN).astype(np.int8)
    binding = np.full(len(t), -1, dtype=np.int64)  # not used by a replay
    small = replace(
        graph, t=t, event=graph.event[kept], src=src, dst=dst, weight=np.zeros(m), nominal=np.zeros(m),
        kind=kind, category=graph.category[heads], owner=graph.owner[heads], flag=graph.flag[heads],
        binding=binding,
        steps=[StepNodes(s.name, int(new_id[s.start]), int(new_id[s.end])) for s in graph.steps],
        window_node=int(new_id[graph.window_node]) if graph.window_node >= 0 else -1,
        arrival=np.where(graph.arrival >= 0, new_id[np.maximum(graph.arrival, 0)], -1),
        completion=np.where(graph.completion >= 0, new_id[np.maximum(graph.completion, 0)], -1),
        early={int(new_id[a]): int(new_id[b]) for a, b in graph.early.items()})
    assert member is None or n_edges == len(member), "every edge belongs to one run"
    return Contracted(small, member, first)
