"""The job's graph of one cycle: every rank's reduced graph (:class:`~.reduced.RankPaths`) joined at
the collectives the ranks share (:class:`CycleGraph`), replayed under a :class:`Scenario`.

Per rank the nodes are its window's start ``W`` (fixed), every collective's arrival ``A`` and
completion ``E`` and every step's end ``T``; an arrival or a step end depends on the labels before
it as its reduced graph says.  Per matched collective (the matcher's process group + sequence
number, else order: :func:`~..analyzers.collective_match.match_collectives`; send / recv pairs
too), a join node ``J`` is the last rank's arrival, and each rank's completion comes after it by
what the transfer took on that rank: a collective cannot end on any rank before the last rank has
arrived.  Replayed as measured, every node gets its measured time back; a scenario replays it with
some ranks' tables swapped for a what-if's (:mod:`.variants`) or with their dependencies changed
(a rank like the median), and the job's step comes out of it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment, aligned_comms
from torchprof_args.analysis.analyzers.clocks import align_clocks
from torchprof_args.analysis.analyzers.collective_match import (
    CollectiveInstance,
    experts_side,
    match_collectives,
)
from torchprof_args.analysis.analyzers.collectives import CommRecord, CompactRecords, RankComms
from torchprof_args.analysis.critical_path.propagate import NONE, WINDOW, step_of_label
from torchprof_args.analysis.critical_path.reduced import MEASURED, Into, PathStep, RankPaths
from torchprof_args.analysis.trace import StepSpan

__all__ = ["CycleGraph", "Replayed", "Scenario", "clocks_of_paths", "cycle_graph", "expert_work_per_step",
           "mean_into", "median_into"]

W, A, E, T, J = "W", "A", "E", "T", "J"
#: among nodes at the same measured time, the order they are replayed in (what they depend on first).
_KIND_ORDER = {W: 0, E: 1, T: 2, A: 3, J: 4}


@dataclass
class Scenario:
    """What a replay changes: per rank the table it uses (a cause of :mod:`.variants`; a rank
    without it uses the measured one), and sinks' dependencies replaced, by ``(rank, kind, index)``
    (kind ``A`` an arrival by record index, ``T`` a step end by step index)."""

    tables: Mapping[int, str] = field(default_factory=dict)
    into: Mapping[tuple[int, str, int], Into] = field(default_factory=dict)


@dataclass
class Replayed:
    """A replay of the cycle's graph: each node's time and what bound it (-1: fixed)."""

    time: list[float]
    binding: list[int]


@dataclass
class CycleGraph:
    """The cycle's graph (see the module's docstring).  Node ``v``: ``kind[v]``, ``rank[v]``,
    ``index[v]`` (record, step or instance index), ``measured[v]`` (absolute us)."""

    parts: dict[int, RankPaths]
    kind: list[str] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)
    nodes: dict[tuple[str, int, int], int] = field(default_factory=dict)
    members: dict[int, list[int]] = field(default_factory=dict)
    joined: dict[int, tuple[int, float]] = field(default_factory=dict)
    local: dict[int, tuple[int, float]] = field(default_factory=dict)
    instances: list[CollectiveInstance] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: completions joined to their collective's last arrival, and those left out (clocks disagree).
    joins: int = 0
    dropped_joins: int = 0
    #: the hosts' clocks (every time above on the reference host's when aligned).
    clock: ClockAlignment | None = None
    #: the arrivals ``(rank, record index)`` at a variable-size all-to-all whose sent side is the
    #: experts' (an MoE combine, or a dispatch's gradient): the stretch into each is expert work.
    expert_arrivals: set[tuple[int, int]] = field(default_factory=set)

    @property
    def joined_reliably(self) -> bool:
        """Whether the ranks' collectives were joined: at most 10 % of the completions left out
        (more means the ranks' clocks, or the matching of their collectives, disagree)."""
        return self.dropped_joins <= 0.1 * (self.joins + self.dropped_joins)

    @property
    def ranks(self) -> list[int]:
        """The ranks, in order."""
        return sorted(self.parts)

    def add(self, kind: str, rank: int, index: int, measured: float) -> int:
        """A new node."""
        node = len(self.kind)
        self.kind.append(kind)
        self.rank.append(rank)
        self.index.append(index)
        self.measured.append(measured)
        self.nodes[(kind, rank, index)] = node
        return node

    def label_node(self, rank: int, label: int) -> int | None:
        """The node of one of ``rank``'s labels."""
        if label == WINDOW:
            return self.nodes[(W, rank, 0)]
        step = step_of_label(label)
        if step is not None:
            return self.nodes.get((T, rank, step))
        return self.nodes.get((E, rank, label))

    def into(self, node: int, scenario: Scenario) -> Into | None:
        """The dependencies of a sink (an arrival or a step end) in ``scenario``."""
        kind, rank, index = self.kind[node], self.rank[node], self.index[node]
        found = scenario.into.get((rank, kind, index))
        if found is not None:
            return found
        part = self.parts[rank]
        table = scenario.tables.get(rank, MEASURED)
        rows = part.arrivals if kind == A else part.step_ends
        chosen = rows.get(table) or rows[MEASURED]
        return chosen[index]

    def preds(self, node: int, scenario: Scenario) -> list[tuple[int, float]]:
        """(node, weight) of everything ``node`` waits for in ``scenario``."""
        kind = self.kind[node]
        if kind == J:
            return [(a, 0.0) for a in self.members[node]]
        if kind == E:
            out = []
            if node in self.joined:
                out.append(self.joined[node])
            if node in self.local:
                out.append(self.local[node])
            return out
        if kind in (A, T):
            into = self.into(node, scenario)
            if into is None:
                return []
            rank = self.rank[node]
            out = []
            for label, d in ((into.label1, into.d1), (into.label2, into.d2)):
                if label != NONE and (found := self.label_node(rank, label)) is not None:
                    out.append((found, d))
            return out
        return []

    def replay(self, scenario: Scenario | None = None) -> Replayed:
        """Every node's time in ``scenario`` (default: as measured)."""
        scenario = scenario or Scenario()
        n = len(self.kind)
        time = [0.0] * n
        binding = [-1] * n
        done = [False] * n
        order = sorted(range(n), key=lambda v: (self.measured[v], _KIND_ORDER[self.kind[v]]))
        for root in order:
            stack = [root]
            while stack:
                v = stack[-1]
                if done[v]:
                    stack.pop()
                    continue
                preds = self.preds(v, scenario)
                waiting = [u for u, _ in preds if not done[u]]
                if waiting:
                    stack.extend(waiting)
                    continue
                stack.pop()
                if not preds:
                    time[v] = self.measured[v]
                else:
                    best = max(range(len(preds)), key=lambda i: time[preds[i][0]] + preds[i][1])
                    time[v] = time[preds[best][0]] + preds[best][1]
                    binding[v] = preds[best][0]
                done[v] = True
        return Replayed(time, binding)

    def step_ms(self, replayed: Replayed) -> float | None:
        """The job's step in a replay: the slowest rank's mean step (its window over its steps)."""
        means = []
        for rank, part in self.parts.items():
            if part.steps:
                end = replayed.time[self.nodes[(T, rank, len(part.steps) - 1)]]
                means.append((end - part.window_us) / len(part.steps))
        return max(means) / 1e3 if means else None


def _rank_of(part: RankPaths, position: int, rank_of: Callable[[RankPaths, int], int] | None) -> int:
    if rank_of is not None:
        return rank_of(part, position)
    return part.rank if isinstance(part.rank, int) else position


def _comms(rank: int, part: RankPaths) -> RankComms:
    return RankComms(rank=rank, file="", source=None, records=part.collectives.records(),
                     world_size=part.world_size, pg_config=[], host=part.host,
                     steps=[StepSpan(name=s.name, start_us=s.start_us, dur_us=s.end_us - s.start_us)
                            for s in part.steps])


def clocks_of_paths(parts: Sequence[RankPaths], rank_of: Callable[[RankPaths, int], int] | None = None,
                    apply: bool = True) -> ClockAlignment:
    """The hosts' clocks of one cycle, from its ranks' reduced graphs (their collective records)."""
    return align_clocks([_comms(_rank_of(p, i, rank_of), p) for i, p in enumerate(parts)], apply=apply)


def _on_reference_clock(rank: int, part: RankPaths, clock: ClockAlignment) -> RankPaths:
    """``part`` with every time on the reference host's clock."""
    if not clock.aligned or clock.host_of(rank) is None:
        return part

    def moved(t: float) -> float:
        return t + clock.offset_us(rank, t)

    return msgspec.structs.replace(
        part, window_us=moved(part.window_us),
        steps=[PathStep(s.name, moved(s.start_us), moved(s.end_us)) for s in part.steps],
        collectives=CompactRecords.of(aligned_comms(_comms(rank, part), clock).records),
        completion_us=[None if t is None else moved(t) for t in part.completion_us])


def cycle_graph(parts: Sequence[RankPaths], rank_of: Callable[[RankPaths, int], int] | None = None,
                clock: ClockAlignment | None = None) -> CycleGraph:
    """The cycle's graph from its ranks' reduced graphs.

    Args:
        parts: one per rank.
        rank_of: the rank of a part (default: its own, else its position).
        clock: the hosts' clocks (:func:`clocks_of_paths`, or ``diagnose``'s); None: estimated here.

    Returns:
        The :class:`CycleGraph`, its notes saying what it could not join.
    """
    ranked = {_rank_of(p, i, rank_of): p for i, p in enumerate(parts)}
    order = list(ranked)
    clock = clock if clock is not None else clocks_of_paths(list(ranked.values()), lambda p, i: order[i])
    graph = CycleGraph({rank: _on_reference_clock(rank, p, clock) for rank, p in ranked.items()}, clock=clock)
    records: dict[int, list[CommRecord]] = {}
    for rank, part in sorted(graph.parts.items()):
        records[rank] = part.collectives.records()
        graph.add(W, rank, 0, part.window_us)
        for i, step in enumerate(part.steps):
            graph.add(T, rank, i, step.end_us)
        measured_arrivals = part.arrivals.get(MEASURED, [])
        for i, (record, done) in enumerate(zip(records[rank], part.completion_us, strict=True)):
            if done is None or i >= len(measured_arrivals) or measured_arrivals[i] is None:
                continue
            a = graph.add(A, rank, i, record.start_us)
            e = graph.add(E, rank, i, done)
            graph.local[e] = (a, done - record.start_us)
        graph.notes += part.notes
    _join(graph, records)
    return graph


def _join(graph: CycleGraph, records: dict[int, list[CommRecord]]) -> None:
    """Add a join node per collective two or more ranks share, and each rank's completion after it."""
    world = next((p.world_size for p in graph.parts.values() if p.world_size), None)
    if world and len(graph.parts) < world:
        graph.notes.append(f"{len(graph.parts)} of {world} ranks' traces: the path runs through these ranks "
                           "only (a missing rank's time shows as waiting for it)")
    with_records = [r for r in graph.ranks if records[r]]
    if len(with_records) < 2:
        if len(graph.parts) > 1:
            graph.notes.append("fewer than two ranks have collectives: the ranks' paths are not joined "
                               "(record with the collectives' ranks, e.g. --torch-profile-ranks all)")
        return
    positions = {r: {id(rec): i for i, rec in enumerate(records[r])} for r in with_records}
    comms = [RankComms(rank=r, file="", source=None, records=records[r],
                       world_size=graph.parts[r].world_size, pg_config=[], host=graph.parts[r].host)
             for r in with_records]
    members: dict[int, dict[int, CommRecord]] = {}
    match = match_collectives(comms, top=0, members=members)
    graph.instances = match["instances"]
    clock = graph.clock
    dropped = unmatched = 0
    for index, found in members.items():
        arrivals = [(r, positions[r][id(rec)]) for r, rec in found.items()]
        nodes = [(graph.nodes[(A, r, i)], graph.nodes[(E, r, i)]) for r, i in arrivals
                 if (A, r, i) in graph.nodes and (E, r, i) in graph.nodes]
        if len(nodes) < 2:
            unmatched += len(found) == 1
            continue
        if experts_side(graph.instances[index]["bytes_by_rank"]) == 0:
            graph.expert_arrivals.update(arrivals)
        last_arrival = max((a for a, _ in nodes), key=lambda a: graph.measured[a])
        last = graph.measured[last_arrival]
        j = graph.add(J, -1, index, last)
        graph.members[j] = [a for a, _ in nodes]
        for a, e in nodes:
            # on another host the two times are as far apart as the clocks' stated uncertainty: a
            # completion that early is joined with no transfer (the replay puts it at the arrival)
            slack = clock.uncertainty_between_us(graph.rank[e], graph.rank[last_arrival]) if clock else 0.0
            if graph.measured[e] >= last - slack:
                transfer = max(graph.measured[e] - last, 0.0)
                graph.joined[e] = (j, transfer)
                graph.local[e] = (a, transfer)  # its own arrival plus the transfer, at least
                graph.joins += 1
            else:
                dropped += 1
                graph.dropped_joins += 1
    if unmatched:
        graph.notes.append(f"{unmatched} collective records have no counterpart on the other ranks: "
                           "their time is taken as measured on their rank")
    if dropped:
        graph.notes.append(f"{dropped} collective completions precede the last rank's arrival by more than "
                           "the hosts' clocks' uncertainty (the clocks, or the matching of the collectives, "
                           "disagree): those joins were left out")


def work_per_step(graph: CycleGraph, scenario: Scenario | None = None) -> dict[int, float]:
    """Each rank's own work per step (us): the work on the binding paths into its sinks (arrivals
    and step ends), which between them cover the rank's time between its labels once."""
    scenario = scenario or Scenario()
    out: dict[int, float] = {}
    for v, kind in enumerate(graph.kind):
        if kind in (A, T) and (into := graph.into(v, scenario)) is not None:
            out[graph.rank[v]] = out.get(graph.rank[v], 0.0) + into.w1
    return {r: w / max(len(graph.parts[r].steps), 1) for r, w in out.items()}


def _scaled_into(graph: CycleGraph, keep: Mapping[int, float]) -> dict[tuple[int, str, int], Into]:
    """Each rank of ``keep``'s sinks with its own work scaled by ``keep[rank]`` on every path into
    every sink (the work, not the waiting)."""
    out: dict[tuple[int, str, int], Into] = {}
    base = Scenario()
    for v, kind in enumerate(graph.kind):
        rank = graph.rank[v]
        if rank not in keep or kind not in (A, T) or (into := graph.into(v, base)) is None:
            continue
        factor = keep[rank]
        out[(rank, kind, graph.index[v])] = msgspec.structs.replace(
            into, d1=into.d1 - into.w1 * (1 - factor), d2=into.d2 - into.w2 * (1 - factor),
            w1=into.w1 * factor, w2=into.w2 * factor)
    return out


def median_into(graph: CycleGraph, ranks: Sequence[int]) -> dict[tuple[int, str, int], Into]:
    """``ranks``' sinks with their own work cut to the median rank's: each rank's work per step
    (:func:`work_per_step`) scaled to the median of the other ranks' (of all ranks when ``ranks``
    is all of them), on every path into every sink (the work, not the waiting: a rank as fast as
    the median still waits for the slowest)."""
    work = work_per_step(graph)
    keep: dict[int, float] = {}
    for rank in ranks:
        others = [w for r, w in work.items() if r not in ranks] or list(work.values())
        mine = work.get(rank, 0.0)
        if others and mine > 0:
            keep[rank] = min(statistics.median(others) / mine, 1.0)
    return _scaled_into(graph, keep)


@dataclass(frozen=True)
class _Stretch:
    """One expert stretch of a rank: its start label's and its arrival's measured times, and its own
    work in a scenario (the path's work less the stretches nested in it, which the path also runs)."""

    begin: float
    end: float
    own_us: float


def _expert_stretches(graph: CycleGraph, scenario: Scenario) -> dict[int, list[_Stretch]]:
    """Per rank, its expert stretches (:attr:`CycleGraph.expert_arrivals`), each with its own work.

    The path into an arrival runs from its start label through everything the rank's thread did
    since, so a stretch that starts after another's label and ends before its arrival (the backward's
    combine inside a longer path) is on both paths: counted once, in the inner one.  One sort and a
    stack: the stretches nest or are apart."""
    found: dict[int, list[tuple[float, float, float, int]]] = {r: [] for r in graph.ranks}
    for v, kind in enumerate(graph.kind):
        rank = graph.rank[v]
        if kind != A or (rank, graph.index[v]) not in graph.expert_arrivals:
            continue
        into = graph.into(v, scenario)
        start = None if into is None else graph.label_node(rank, into.label1)
        if into is not None and start is not None:
            found[rank].append((graph.measured[start], graph.measured[v], into.w1, v))
    out: dict[int, list[_Stretch]] = {}
    for rank, rows in found.items():
        rows.sort(key=lambda row: (row[0], -row[1], row[3]))
        inner = [0.0] * len(rows)  # the work of the stretches directly inside each
        open_: list[int] = []  # the stretches around the current one, the innermost last
        for i, (_, end, w, _) in enumerate(rows):
            while open_ and rows[open_[-1]][1] < end:
                open_.pop()
            if open_:
                inner[open_[-1]] += w
            open_.append(i)
        out[rank] = [_Stretch(begin, end, w - inner[i]) for i, (begin, end, w, _) in enumerate(rows)]
    return out


def expert_work_per_step(graph: CycleGraph, scenario: Scenario | None = None) -> dict[int, float]:
    """Each rank's expert work per step (us) in ``scenario`` (default: as measured): its own work on
    the paths into its arrivals at the experts' side of the variable-size all-to-alls since the last
    completion (:attr:`CycleGraph.expert_arrivals`: the stretch from the dispatch to the combine,
    forward and backward), each stretch's work counted once (:func:`_expert_stretches`)."""
    stretches = _expert_stretches(graph, scenario or Scenario())
    return {r: sum(s.own_us for s in rows) / max(len(graph.parts[r].steps), 1)
            for r, rows in stretches.items()}


def mean_into(graph: CycleGraph) -> dict[tuple[int, str, int], Into]:
    """Every rank's expert work (:func:`expert_work_per_step`) scaled to the ranks' mean: the heavy
    ranks' down to it, the light ranks' up to it, the total kept (a balanced MoE router moves the
    heavy ranks' tokens to the light ranks' experts: the work moves, it is not removed).  Each expert
    stretch's own work changes by its share, and so does every path of the rank that runs through it
    (from a label at or before the stretch's start to a sink after it: an outer stretch, an
    asynchronous collective issued after the experts, the step's end).  Empty (the measured replay)
    without variable-size all-to-alls."""
    work = expert_work_per_step(graph)
    if not graph.expert_arrivals or not work:
        return {}
    mean = statistics.fmean(work.values())
    base = Scenario()
    # per rank, each expert stretch: (its start label's time, its arrival's time, how much it changes)
    stretches = {rank: [(s.begin, s.end, s.own_us * (mean / work[rank] - 1)) for s in rows]
                 for rank, rows in _expert_stretches(graph, base).items() if work.get(rank, 0.0) > 0}
    out: dict[tuple[int, str, int], Into] = {}
    for v, kind in enumerate(graph.kind):
        rank = graph.rank[v]
        if kind not in (A, T) or not stretches.get(rank) or (into := graph.into(v, base)) is None:
            continue
        # a path from a label at or before an expert stretch's start to a sink after it holds the stretch
        # (the rank's thread runs it on the way): it changes by what the stretch changes
        shifted = []
        for label, d, w in ((into.label1, into.d1, into.w1), (into.label2, into.d2, into.w2)):
            node = graph.label_node(rank, label) if label != NONE else None
            covered = 0.0 if node is None else sum(
                delta for begin, end, delta in stretches[rank]
                if graph.measured[node] <= begin and end <= graph.measured[v])
            shifted.append((max(d + covered, d - w), max(w + covered, 0.0)))
        if shifted[0][0] != into.d1 or shifted[1][0] != into.d2:
            out[(rank, kind, graph.index[v])] = msgspec.structs.replace(
                into, d1=shifted[0][0], w1=shifted[0][1], d2=shifted[1][0], w2=shifted[1][1])
    return out
