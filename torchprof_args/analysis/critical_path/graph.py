"""One rank's dependency graph (:class:`LocalGraph`), built from its trace by :func:`local_graph`.

Nodes are points in time: the start and the end of every CPU event (:mod:`.cpu_graph`) and of every
kernel (:mod:`.gpu_graph`).  An edge ``u -> v`` says ``v`` cannot happen before ``u`` plus the
edge's weight.  Edges carry a *nominal* weight (the work between the nodes, 0 for a pure
dependency); of the edges into a node, the one that made it happen when it did (the *binding* edge:
the latest source plus nominal weight, ties to the one carrying work) gets the whole measured delay,
so that replaying the graph (:mod:`.propagate`) gives back every measured time exactly.  The
critical path is then the chain of binding edges back from a step's end, and a what-if is a replay
with some weights changed.

The rank's collectives (:func:`~..analyzers.collectives.rank_collectives`, with ``comms=True``) are
tied to their nodes: the arrival (a NCCL kernel's start, gloo's span's start) and the completion,
where :mod:`.cycle` joins the ranks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.collectives import (
    SOURCE_GLOO,
    SOURCE_KERNELS,
    CommRecord,
    rank_collectives,
)
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.critical_path.cpu_graph import CpuEvents, cpu_edges, cpu_events
from torchprof_args.analysis.critical_path.edges import (
    CHAIN,
    INDEX,
    INFER,
    ISSUE,
    JOIN,
    KERNEL,
    LAUNCH_EDGE,
    STREAM,
    SYNC,
    WAIT,
    WAKE,
    EdgeList,
)
from torchprof_args.analysis.critical_path.gpu_graph import Kernels, gpu_edges, gpu_events
from torchprof_args.analysis.trace import Trace

__all__ = ["LocalGraph", "StepNodes", "local_graph", "topological_order"]

#: the binding edges are found for nodes in blocks of about this many incoming edges.
_BIND_BLOCK = 1 << 18
#: among edges that tie for binding, the kind preferred (lower first): work, then what was waited for.
_PRIORITY = {KERNEL: 0, CHAIN: 1, SYNC: 2, WAIT: 2, JOIN: 2, STREAM: 3, INFER: 4, ISSUE: 5, WAKE: 5,
             LAUNCH_EDGE: 6}


@dataclass(frozen=True)
class StepNodes:
    """One step: its name and the nodes of its start and end."""

    name: str
    start: int
    end: int


@dataclass
class LocalGraph:
    """One rank's dependency graph (see the module's docstring).

    Node ``v``: ``t[v]`` (trace-relative us), ``event[v]`` (-1: none), ``binding[v]`` (its binding
    edge, -1: a source).  Edge ``e``: ``src``, ``dst``, ``weight`` (the binding edges' with their
    measured delay), ``nominal``, ``kind`` (:mod:`.edges`), ``category`` (:mod:`.categories`),
    ``owner`` (the event its time is attributed to), ``flag``.  ``order`` (computed when first
    used): the nodes in topological order; ``in_ptr`` / ``in_edges`` (also computed when first
    used, by a replay: the builder's own copy is not kept): each node's incoming edges (CSR).
    Node and edge indices are :data:`~.edges.INDEX` (int32), times and weights float64, kinds and
    categories int8.
    """

    trace: Trace
    t: np.ndarray
    event: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    nominal: np.ndarray
    kind: np.ndarray
    category: np.ndarray
    owner: np.ndarray
    flag: np.ndarray
    binding: np.ndarray
    cpu: CpuEvents
    kernels: Kernels
    steps: list[StepNodes]
    window_node: int
    records: list[CommRecord] = field(default_factory=list)
    arrival: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    completion: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    notes: list[str] = field(default_factory=list)
    #: completions that are where a waiting thread resumed (a what-if that cuts the wait frees them),
    #: each with the end of gloo's span, which completes with it (its time is measured after it).
    early: dict[int, int] = field(default_factory=dict)

    @functools.cached_property
    def order(self) -> np.ndarray:
        """The nodes in topological order (:func:`topological_order`), computed when first replayed:
        a rank's paths replay only its contracted graph (:mod:`.contract`)."""
        return topological_order(self.t, self.src, self.dst)

    @functools.cached_property
    def _incoming(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self.dst, len(self.t))

    @property
    def in_ptr(self) -> np.ndarray:
        """Node ``v``'s incoming edges are ``in_edges[in_ptr[v]:in_ptr[v + 1]]``."""
        return self._incoming[0]

    @property
    def in_edges(self) -> np.ndarray:
        """The edges by destination, in index order within each (see :attr:`in_ptr`)."""
        return self._incoming[1]

    @property
    def base_us(self) -> float:
        """The trace's base time (us): node times plus this are the job's absolute times."""
        return self.trace.base_time_ns / 1000.0

    def name(self, event: int) -> str:
        """The name of ``event`` (``-`` for none)."""
        return self.trace.names[self.trace.name_id[event]] if event >= 0 else "-"


def local_graph(trace: Trace) -> LocalGraph:
    """The dependency graph of one rank's trace (``comms=True``: its collectives tied to their nodes).

    Args:
        trace: one rank's trace.

    Returns:
        The :class:`LocalGraph`; a trace without steps is one step from its first event to its last
        (a note says so).
    """
    cpu = cpu_events(trace)
    n = len(cpu)
    kernels = gpu_events(trace, cpu, 2 * n)
    t = np.concatenate([trace.ts[cpu.events], trace.ts[kernels.events]])  # starts, then ends
    ends = t + np.maximum(np.concatenate([trace.dur[cpu.events], trace.dur[kernels.events]]), 0.0)
    t = np.concatenate([t[:n], ends[:n], t[n:], ends[n:]])
    del ends
    event = np.concatenate([cpu.events, cpu.events, kernels.events, kernels.events])
    edges = EdgeList(t)  # a dependency against the clocks is left out as it is added
    early = cpu_edges(trace, cpu, edges)
    gpu_edges(trace, cpu, kernels, edges)
    src, dst, nominal, kind, category, owner, flag = edges.arrays()
    del edges
    binding, weight = _bind(t, src, dst, nominal, kind, *_csr(dst, len(t)))
    graph = LocalGraph(trace, t, event, src, dst, weight, nominal, kind, category, owner, flag, binding,
                       cpu, kernels, [], -1)
    _add_steps(graph)
    if trace.comms is not None:
        _add_records(graph, {int(cpu.events[run]): node for run, node in early.items()})
    return graph


def _bind(t: np.ndarray, src: np.ndarray, dst: np.ndarray, nominal: np.ndarray, kind: np.ndarray,
          in_ptr: np.ndarray, in_edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's binding edge (-1: none) and the weights with the binding edges' measured delay.

    Per node its edges in index order (``in_edges``, the CSR's); then the latest value, the most
    work, the preferred kind, the first edge: a maximum per node per key, not a sort by four keys.
    Nodes in blocks of about :data:`_BIND_BLOCK` incoming edges (bounds the temporaries)."""
    binding = np.full(len(t), -1, dtype=INDEX)
    weight = nominal.copy()
    table = np.array([_PRIORITY.get(k, 9) for k in range(16)], dtype=np.float64)
    lo = 0
    while lo < len(t):
        hi = max(int(np.searchsorted(in_ptr, in_ptr[lo] + _BIND_BLOCK, side="right")) - 1, lo + 1)
        hi = min(hi, len(t))
        edges = in_edges[in_ptr[lo]:in_ptr[hi]]
        if len(edges):
            counts = np.diff(in_ptr[lo:hi + 1])
            starts = (in_ptr[lo:hi] - in_ptr[lo])[counts > 0]
            group = np.repeat(np.arange(len(starts), dtype=INDEX), counts[counts > 0])
            best = np.ones(len(edges), dtype=bool)
            for ranked in (t[src[edges]] + nominal[edges], nominal[edges], -table[kind[edges]]):
                top = np.maximum.reduceat(np.where(best, ranked, -np.inf), starts)
                best &= ranked == top[group]
            kept = np.flatnonzero(best)
            first = edges[kept[np.r_[True, group[kept][1:] != group[kept][:-1]]]]
            binding[dst[first]] = first
            weight[first] = t[dst[first]] - t[src[first]]
        lo = hi
    return binding, weight


def _csr(dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each node's incoming edges: ``in_edges[in_ptr[v]:in_ptr[v + 1]]``, in index order."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    return ptr, np.argsort(dst, kind="stable").astype(INDEX)


def topological_order(t: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The nodes by time; nodes at the same time as a node they depend on come after it (levels
    over the equal-time edges, found by relaxation)."""
    level = np.zeros(len(t), dtype=INDEX)
    tie = t[src] == t[dst]
    s, d = src[tie], dst[tie]
    for _ in range(64):
        if not len(s):
            break
        want = level[s] + 1
        behind = want > level[d]
        if not behind.any():
            break
        np.maximum.at(level, d[behind], want[behind])
    return np.lexsort((level, t)).astype(INDEX)


def _add_steps(graph: LocalGraph) -> None:
    trace, cpu = graph.trace, graph.cpu
    rows = steps(trace)
    positions = np.flatnonzero(cpu.step)
    by_key = {(trace.names[trace.name_id[cpu.events[k]]], float(trace.ts[cpu.events[k]])): int(k)
              for k in positions.tolist()}
    for row in rows:
        k = by_key.get((row["name"], row["start_us"]))
        if k is not None:
            graph.steps.append(StepNodes(row["name"], int(cpu.start_node[k]), int(cpu.end_node[k])))
    if graph.steps:
        graph.window_node = graph.steps[0].start
    elif len(graph.t):
        first, last = int(np.argmin(graph.t)), int(np.argmax(graph.t))
        graph.steps.append(StepNodes("whole trace", first, last))
        graph.window_node = first
        graph.notes.append(f"{trace.path}: no ProfilerStep in the trace: the whole trace is one step "
                           "(record with TorchProfiler or prof.step() for per-step paths)")


def _add_records(graph: LocalGraph, early: dict[int, int]) -> None:
    """Tie each collective record to its arrival and completion nodes (-1 where it has none; a gloo
    collective whose waiting thread resumed before its span ended completed there: ``early``, by
    the span's event)."""
    trace = graph.trace
    comms = rank_collectives(trace)
    graph.records = comms.records
    base = graph.base_us
    nodes: dict[tuple[float, float], tuple[int, int]] = {}
    if comms.source == SOURCE_KERNELS:
        k = graph.kernels
        starts = np.array([r.start_us for r in comms.records], dtype=np.float64)
        # only the kernels that start when a record does can be one (the rest: no dict entry each)
        for j in np.flatnonzero(np.isin(trace.ts[k.events] + base, starts)).tolist():
            e = int(k.events[j])
            key = (float(trace.ts[e]) + base, float(trace.dur[e]))
            nodes[key] = (int(k.start_node[j]), int(k.end_node[j]))
    elif comms.source == SOURCE_GLOO:
        cpu = graph.cpu
        for p in np.flatnonzero(cpu.run).tolist():
            e = int(cpu.events[p])
            done = early.get(e, int(cpu.end_node[p]))
            nodes[(float(trace.ts[e]) + base, float(trace.dur[e]))] = (int(cpu.start_node[p]), done)
            if e in early:
                graph.early[done] = int(cpu.end_node[p])
    found = [nodes.get((r.start_us, r.dur_us), (-1, -1)) for r in comms.records]
    graph.arrival = np.array([a for a, _ in found], dtype=np.int64)
    graph.completion = np.array([b for _, b in found], dtype=np.int64)


def describe(graph: LocalGraph) -> dict[str, Any]:
    """Counts of the graph's nodes and edges by kind (for tests and ``--json``'s debugging)."""
    from torchprof_args.analysis.critical_path.edges import EDGE_KINDS

    return {"nodes": int(len(graph.t)),
            "edges": {EDGE_KINDS[k]: int(c)
                      for k, c in enumerate(np.bincount(graph.kind, minlength=len(EDGE_KINDS))) if c}}
