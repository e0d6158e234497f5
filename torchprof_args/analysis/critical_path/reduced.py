"""The reduced graph of one rank (:class:`RankPaths`): what the cross-rank path needs of it, small
enough for the trace's summary sidecar.

The rank's full graph (:mod:`.graph`) is replayed (:mod:`.propagate`) as measured and once per cause
of lost time it has (:mod:`.variants`).  Of each replay only the *sinks* are kept: every
collective's arrival and every step's end, each as ``max(t(label1) + d1, t(label2) + d2)`` over the
collectives' completions before it (or the window's start).  So 512 ranks' paths and what-ifs are
computed from their sidecars (:mod:`.cycle`), and the full graph is built only to look closer.

For the measured replay each sink also keeps the path that binds it (:class:`Piece`): its time by
category and its top contributors (operators, kernels, with their Python call site when the trace
recorded stacks).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.callsites import call_sites, has_stacks
from torchprof_args.analysis.analyzers.collectives import CompactRecords
from torchprof_args.analysis.analyzers.steps import STEP_RE
from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.graph import LocalGraph, local_graph
from torchprof_args.analysis.critical_path.propagate import NONE, WINDOW, Replay, replay, step_of_label
from torchprof_args.analysis.critical_path.variants import CAUSES, Change, cause_change
from torchprof_args.analysis.trace import Trace

__all__ = ["MEASURED", "PATHS_FORMAT", "Contributor", "Into", "Piece", "RankPaths", "StepSpan", "rank_paths",
           "tables"]

#: the version of :class:`RankPaths` (a sidecar holding another is ignored: the trace is parsed).
PATHS_FORMAT = 1
#: the name of the measured replay's tables.
MEASURED = "measured"
#: contributors kept per sink.
TOP = 8
#: a contributor's name for time on a thread inside no operator (Python between operators).
BETWEEN = "[CPU time between operators]"


class Contributor(msgspec.Struct, frozen=True, array_like=True):
    """An operator or kernel's time on a path: name, category, us, Python call site (or None)."""

    name: str
    category: str
    us: float
    site: str | None = None


class Piece(msgspec.Struct, frozen=True):
    """The path that binds one sink, from its label: time by category (us, in
    :data:`~.categories.CATEGORIES` order) and the top contributors."""

    by_category: list[float]
    top: list[Contributor]


class Into(msgspec.Struct, frozen=True, array_like=True):
    """How a sink depends on the labels before it: ``max(t(label1) + d1, t(label2) + d2)``; a label
    is a collective's record index (its completion), -1 the window's start, -2 none, -3 - n the end
    of step n.  ``w1`` / ``w2``: how much of ``d1`` / ``d2`` is the rank's own work (not waiting,
    communication or host synchronisation): what a rank as fast as the median has less of."""

    label1: int
    d1: float
    label2: int
    d2: float
    w1: float = 0.0
    w2: float = 0.0


class StepSpan(msgspec.Struct, frozen=True, array_like=True):
    """One step: name, start and end (absolute us)."""

    name: str
    start_us: float
    end_us: float


class RankPaths(msgspec.Struct, frozen=True):
    """One rank's reduced graph (the sidecar's ``critical_path``).

    Attributes:
        format: :data:`PATHS_FORMAT`.
        rank: the trace's rank (None: the trace does not say; the file name may).
        world_size: the trace's world size, when it says.
        window_us: the window's start (the first step's start), absolute us.
        steps: the steps (absolute us).
        collectives: the rank's collective records (absolute us), as ``diagnose`` keeps them.
        completion_us: per record, when it completed on this rank (None: not in the graph).
        arrivals: per replay (:data:`MEASURED`, then each cause the rank has), per record, how its
            arrival depends on earlier completions (None: not in the graph).
        step_ends: per replay, per step, how its end does.
        pieces: per record, the measured path into its arrival (None: not in the graph).
        step_pieces: per step, the measured path into its end.
        notes: what the graph could not use.
    """

    format: int
    rank: int | None
    world_size: int | None
    window_us: float
    steps: list[StepSpan]
    collectives: CompactRecords
    completion_us: list[float | None]
    arrivals: dict[str, list[Into | None]]
    step_ends: dict[str, list[Into]]
    pieces: list[Piece | None]
    step_pieces: list[Piece]
    notes: list[str]


def label_time(graph: LocalGraph, label: int) -> float:
    """The measured time of a label's node (trace-relative us)."""
    if label == WINDOW:
        return float(graph.t[graph.window_node])
    step = step_of_label(label)
    if step is not None:
        return float(graph.t[graph.steps[step].end])
    return float(graph.t[graph.completion[label]])


def _into(graph: LocalGraph, run: Replay, node: int) -> Into:
    l1, t1, w1, l2, t2, w2, _ = run.value(node)
    d1 = t1 - label_time(graph, l1) if l1 != NONE else 0.0
    d2 = t2 - label_time(graph, l2) if l2 != NONE else 0.0
    return Into(int(l1), float(d1), int(l2), float(d2), float(w1), float(w2) if l2 != NONE else 0.0)


def tables(graph: LocalGraph, change: Change | None = None) -> tuple[list[Into | None], list[Into]]:
    """The sinks' dependencies in one replay of ``graph`` (``change``: a what-if's weights and cuts)."""
    run = replay(graph) if change is None else replay(graph, *change)
    arrivals = [_into(graph, run, int(a)) if a >= 0 else None for a in graph.arrival.tolist()]
    return arrivals, [_into(graph, run, s.end) for s in graph.steps]


def _piece(graph: LocalGraph, run: Replay, node: int) -> tuple[Piece, list[int]]:
    """The binding path into ``node``: its time by category and top contributors, and for each
    contributor the event of its longest edge (for its call site)."""
    by_cat = [0.0] * len(cat.CATEGORIES)
    by_name: dict[tuple[str, int], float] = defaultdict(float)
    example: dict[tuple[str, int], tuple[float, int]] = {}
    v = node
    weight, category, owner, src = graph.weight, graph.category, graph.owner, graph.src
    e = run.value(node)[6]
    for _ in range(len(graph.t)):
        if e < 0:
            break
        w = float(weight[e])
        c = int(category[e])
        by_cat[c] += w
        o = int(owner[e])
        name = graph.name(o) if o >= 0 else BETWEEN
        key = (BETWEEN if STEP_RE.match(name) else name[:160], c)
        by_name[key] += w
        if w > example.get(key, (-1.0, -1))[0]:
            example[key] = (w, o)
        v = int(src[e])
        e = run.via[v]
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:TOP]
    top = [Contributor(name, cat.CATEGORIES[c], round(us, 3)) for (name, c), us in ranked]
    return Piece([round(x, 3) for x in by_cat], top), [example[k][1] for k, _ in ranked]


def _with_sites(piece: Piece, events: list[int], sites: dict[int, str | None]) -> Piece:
    top = [msgspec.structs.replace(c, site=sites.get(e)) if c.name != BETWEEN else c
           for c, e in zip(piece.top, events, strict=True)]
    return msgspec.structs.replace(piece, top=top)


def _pieces(graph: LocalGraph, run: Replay) -> tuple[list[Piece | None], list[Piece]]:
    """The measured paths into every arrival and step end, with call sites when recorded."""
    found = [_piece(graph, run, int(a)) if a >= 0 else None for a in graph.arrival.tolist()]
    ends = [_piece(graph, run, s.end) for s in graph.steps]
    if has_stacks(graph.trace):
        wanted = sorted({e for f in [*found, *ends] if f is not None for e in f[1] if e >= 0})
        sites = dict(zip(wanted, call_sites(graph.trace, np.array(wanted, dtype=np.int64)), strict=True))
        found = [(_with_sites(*f, sites), f[1]) if f is not None else None for f in found]
        ends = [(_with_sites(*f, sites), f[1]) for f in ends]
    return [f[0] if f is not None else None for f in found], [f[0] for f in ends]


def paths_of(graph: LocalGraph, causes: Sequence[str] = tuple(CAUSES)) -> RankPaths:
    """The :class:`RankPaths` of a built graph (the measured replay and one per cause it has)."""
    base = graph.base_us
    measured = replay(graph)
    arrivals = [_into(graph, measured, int(a)) if a >= 0 else None for a in graph.arrival.tolist()]
    ends = [_into(graph, measured, s.end) for s in graph.steps]
    all_arrivals, all_ends = {MEASURED: arrivals}, {MEASURED: ends}
    for cause in causes:
        change = cause_change(graph, cause)
        if change is not None:
            all_arrivals[cause], all_ends[cause] = tables(graph, change)
    pieces, step_pieces = _pieces(graph, measured)
    t = graph.t
    return RankPaths(
        format=PATHS_FORMAT, rank=graph.trace.rank, world_size=graph.trace.world_size,
        window_us=float(t[graph.window_node]) + base if graph.window_node >= 0 else base,
        steps=[StepSpan(s.name, float(t[s.start]) + base, float(t[s.end]) + base) for s in graph.steps],
        collectives=CompactRecords.of(graph.records),
        completion_us=[float(t[c]) + base if c >= 0 else None for c in graph.completion.tolist()],
        arrivals=all_arrivals, step_ends=all_ends, pieces=pieces, step_pieces=step_pieces,
        notes=list(graph.notes))


def rank_paths(trace: Trace) -> RankPaths:
    """One rank's reduced graph (what the summary sidecar keeps).

    Args:
        trace: one rank's trace, loaded with ``comms=True`` (without, the rank has no collectives:
            its path is its own).

    Returns:
        The rank's :class:`RankPaths`.
    """
    return paths_of(local_graph(trace))
