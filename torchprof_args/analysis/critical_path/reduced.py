"""The reduced graph of one rank (:class:`RankPaths`): what the cross-rank path needs of it, small
enough for the trace's summary sidecar.

The rank's full graph (:mod:`.graph`) is replayed (:mod:`.propagate`) as measured and once per cause
of lost time it has (:mod:`.variants`).  Of each replay only the *sinks* are kept: every
collective's arrival and every step's end, each as ``max(t(label1) + d1, t(label2) + d2)`` over the
collectives' completions before it (or the window's start).  So 512 ranks' paths and what-ifs are
computed from their sidecars (:mod:`.cycle`), and the full graph is built only to look closer.

For the measured replay each sink also keeps the path that binds it (:class:`Piece`): its time by
category and its top contributors (operators, kernels, with their Python call site when the trace
recorded stacks), and on an FSDP2 trace its time by FSDP2 phase (:mod:`.fsdp_edges`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.callsites import call_sites, has_stacks
from torchprof_args.analysis.analyzers.collectives import CompactRecords
from torchprof_args.analysis.analyzers.fsdp import FSDP2_STEP_PHASES
from torchprof_args.analysis.analyzers.origin import origin
from torchprof_args.analysis.analyzers.steps import STEP_RE
from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.contract import Contracted, contract
from torchprof_args.analysis.critical_path.edges import INDEX, WAIT
from torchprof_args.analysis.critical_path.fsdp_edges import fsdp_tags
from torchprof_args.analysis.critical_path.graph import LocalGraph, local_graph
from torchprof_args.analysis.critical_path.propagate import NONE, WINDOW, Replay, replay, step_of_label
from torchprof_args.analysis.critical_path.sorting import stable_order
from torchprof_args.analysis.critical_path.variants import CAUSES, Change, cause_change
from torchprof_args.analysis.trace import Trace
from torchprof_args.shared import formats

__all__ = ["MEASURED", "Contributor", "Into", "Piece", "RankPaths", "PathStep", "rank_paths",
           "tables"]

#: the name of the measured replay's tables.
MEASURED = "measured"
#: contributors kept per sink.
TOP_CONTRIBUTORS = 8
#: a contributor's name for time on a thread inside no operator (Python between operators).
BETWEEN = "[CPU time between operators]"
#: the paths' pieces are computed in batches of about this many edges (bounds their memory).
BATCH_EDGES = 1 << 16


class Contributor(msgspec.Struct, frozen=True, array_like=True):
    """An operator or kernel's time on a path: name, category, us, Python call site (or None)."""

    name: str
    category: str
    us: float
    site: str | None = None


class Piece(msgspec.Struct, frozen=True):
    """The path that binds one sink, from its label: time by category (us, in
    :data:`~.categories.CATEGORIES` order), the top contributors, and on an FSDP2 trace its time by
    FSDP2 phase (us, in :data:`~..analyzers.fsdp.FSDP2_STEP_PHASES` order; empty otherwise)."""

    by_category: list[float]
    top: list[Contributor]
    by_phase: list[float] = []


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


class PathStep(msgspec.Struct, frozen=True, array_like=True):
    """One step: name, start and end (absolute us)."""

    name: str
    start_us: float
    end_us: float


class RankPaths(msgspec.Struct, frozen=True):
    """One rank's reduced graph (the sidecar's ``critical_path``).

    Attributes:
        format: ``formats.PATHS.version``.
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
        host: the host the rank ran on (None: neither the trace nor its file name says).
        record_phases: on an FSDP2 trace, per record, the code of its FSDP2 phase (its position in
            :data:`~..analyzers.fsdp.FSDP2_STEP_PHASES`); empty otherwise.
    """

    format: int
    rank: int | None
    world_size: int | None
    window_us: float
    steps: list[PathStep]
    collectives: CompactRecords
    completion_us: list[float | None]
    arrivals: dict[str, list[Into | None]]
    step_ends: dict[str, list[Into]]
    pieces: list[Piece | None]
    step_pieces: list[Piece]
    notes: list[str]
    host: str | None = None
    record_phases: list[int] = []


def label_time(graph: LocalGraph, label: int) -> float:
    """The measured time of a label's node (trace-relative us)."""
    if label == WINDOW:
        return float(graph.t[graph.window_node])
    step = step_of_label(label)
    if step is not None:
        return float(graph.t[graph.steps[step].end])
    return float(graph.t[graph.completion[label]])


def _label_times(graph: LocalGraph, labels: np.ndarray) -> np.ndarray:
    """:func:`label_time` of each of ``labels`` (0 for :data:`~.propagate.NONE`)."""
    out = np.zeros(len(labels))
    window, step, record = labels == WINDOW, labels <= -3, labels >= 0
    if window.any():
        out[window] = graph.t[graph.window_node]
    if step.any():
        out[step] = graph.t[np.array([s.end for s in graph.steps], dtype=np.int64)[-3 - labels[step]]]
    out[record] = graph.t[graph.completion[labels[record]]]
    return out


def _intos(graph: LocalGraph, run: Replay, nodes: Sequence[int]) -> list[Into]:
    """How each of ``nodes`` (sinks of ``run``) depends on the labels before it, all at once."""
    at = np.asarray(nodes, dtype=np.int64)
    l1, t1, w1 = run.label1[at], run.time1[at], run.work1[at]
    l2, t2, w2 = run.label2[at], run.time2[at], run.work2[at]
    for k in np.flatnonzero(np.isin(at, np.fromiter(run.sinks, np.int64, len(run.sinks)))).tolist():
        l1[k], t1[k], w1[k], l2[k], t2[k], w2[k], _ = run.sinks[int(at[k])]  # a step end, as a sink
    d1 = np.where(l1 != NONE, t1 - _label_times(graph, l1), 0.0)
    d2 = np.where(l2 != NONE, t2 - _label_times(graph, l2), 0.0)
    w2 = np.where(l2 != NONE, w2, 0.0)
    return [Into(*row) for row in zip(l1.tolist(), d1.tolist(), l2.tolist(), d2.tolist(), w1.tolist(),
                                      w2.tolist(), strict=True)]


def _sink_tables(graph: LocalGraph, run: Replay) -> tuple[list[Into | None], list[Into]]:
    """Every arrival's (None where it has none) and every step end's dependency in ``run``."""
    arrivals = graph.arrival.tolist()
    found = iter(_intos(graph, run, [a for a in arrivals if a >= 0]))
    ends = _intos(graph, run, [s.end for s in graph.steps])
    return [next(found) if a >= 0 else None for a in arrivals], ends


def tables(graph: LocalGraph, change: Change | None = None,
           small: Contracted | None = None) -> tuple[list[Into | None], list[Into]]:
    """The sinks' dependencies in one replay of ``graph`` (``change``: a what-if's weights and cuts;
    ``small``: ``graph`` contracted, replayed instead, with the same result)."""
    if small is None:
        run, target = (replay(graph) if change is None else replay(graph, *change)), graph
    else:
        weight, cut = change if change is not None else (graph.weight, np.zeros(len(graph.src), dtype=bool))
        target = small.graph
        run = replay(target, small.weights(weight), small.cuts(cut), small.work(weight, graph))
    return _sink_tables(target, run)


def _name_keys(graph: LocalGraph) -> tuple[np.ndarray, list[str]]:
    """Per edge, the index of the name its time goes under (its owner's; the thread's time inside no
    operator, and a step annotation's own, under :data:`BETWEEN`), and the names."""
    trace = graph.trace
    names = [BETWEEN if STEP_RE.match(n) else n[:160] for n in trace.names] + [BETWEEN]
    keys = np.full(len(graph.src), len(trace.names), dtype=INDEX)
    has = graph.owner >= 0
    keys[has] = trace.name_id[graph.owner[has]]
    return keys, names


#: below this many walks still going, the rest are followed one edge at a time (a pass of array
#: operations per edge would cost more than the Python loop).
_LOCKSTEP_WALKS = 16


def _walks(small: Contracted, run: Replay, nodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The binding path into each of ``nodes`` (of the contracted graph ``run`` replays): its
    contracted edges, from the node back to its label; all walks concatenated, and each one's length.

    The walks are followed together, one edge of each per pass of array operations, while many are
    still going; the last few one edge at a time."""
    via, src = run.via, small.graph.src
    live = np.arange(len(nodes), dtype=np.int64)
    at = np.array([run.value(node)[6] for node in nodes], dtype=np.int64)
    walk_of: list[np.ndarray] = []
    step: list[np.ndarray] = []
    while len(live) >= _LOCKSTEP_WALKS:
        going = at >= 0
        live, at = live[going], at[going]
        walk_of.append(live)
        step.append(at)
        at = via[src[at]]
    rest_walk, rest_edge = [], []
    via_list = via.tolist()
    for w, e in zip(live.tolist(), at.tolist(), strict=True):
        while e >= 0:
            rest_walk.append(w)
            rest_edge.append(e)
            e = via_list[int(src[e])]
    walk = np.concatenate([*walk_of, np.array(rest_walk, dtype=np.int64)])
    edge = np.concatenate([*step, np.array(rest_edge, dtype=np.int64)])
    order = stable_order(walk)  # per walk, its edges in the order followed
    return edge[order], np.bincount(walk, minlength=len(nodes))


def _expanded(small: Contracted, chosen: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walks (``chosen``: their contracted edges concatenated; ``lengths``) as the full graph's edges,
    all concatenated, and each edge's walk."""
    first, counts = small.starts[chosen], small.starts[chosen + 1] - small.starts[chosen]
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    path = small.member_edges(np.repeat(first, counts) + np.arange(int(counts.sum())) - offsets)
    return path, np.repeat(np.repeat(np.arange(len(lengths)), lengths), counts)


def _pieces_of(graph: LocalGraph, small: Contracted, run: Replay, nodes: list[int],
               on_path: np.ndarray, phases: np.ndarray | None = None) -> list[tuple[Piece, list[int]]]:
    """Per node of ``nodes``, the binding path into it: its time by category and top contributors (a
    name in a category, :data:`TOP_CONTRIBUTORS` at most, largest first), and for each contributor the
    event of its longest edge (for its call site); the paths' edges marked in ``on_path``; with
    ``phases`` (per edge, its FSDP2 phase's code) their time by phase too.  Paths in batches of about
    :data:`BATCH_EDGES` edges (they overlap: together they can be several times the graph), each
    batch one pass of array operations, not a pass per path."""
    chosen, lengths = _walks(small, run, nodes)
    bounds = np.r_[0, np.cumsum(lengths)]
    spans = small.starts[1:] - small.starts[:-1]
    covered = np.r_[0, np.cumsum(spans[chosen])]
    sizes = (covered[bounds[1:]] - covered[bounds[:-1]]).tolist()  # full edges per walk
    keys = _name_keys(graph)
    out: list[tuple[Piece, list[int]]] = []
    lo = 0
    while lo < len(nodes):
        hi, edges = lo + 1, sizes[lo]
        while hi < len(nodes) and edges + sizes[hi] <= BATCH_EDGES:
            edges += sizes[hi]
            hi += 1
        out += _batch_pieces(graph, small, chosen[bounds[lo]:bounds[hi]], lengths[lo:hi], keys, on_path,
                             phases)
        lo = hi
    return out


def _batch_pieces(graph: LocalGraph, small: Contracted, chosen: np.ndarray, lengths: np.ndarray,
                  keys: tuple[np.ndarray, list[str]], on_path: np.ndarray,
                  phases: np.ndarray | None) -> list[tuple[Piece, list[int]]]:
    """:func:`_pieces_of` for one batch of walks."""
    n_cat = len(cat.CATEGORIES)
    path, piece = _expanded(small, chosen, lengths)
    on_path[path] = True
    weight, category = graph.weight[path], graph.category[path].astype(np.int64)
    by_cat = np.bincount(piece * n_cat + category, weights=weight, minlength=len(lengths) * n_cat)
    key_of, names = keys
    pair = key_of[path] * n_cat + category  # a contributor: a name in a category
    span = int(pair.max()) + 1 if len(pair) else 1
    key = piece * span + pair
    by_key = stable_order(key)  # one sort: paths are contiguous, path order kept within
    key_sorted, w_sorted = key[by_key], weight[by_key]
    starts = np.flatnonzero(np.r_[True, key_sorted[1:] != key_sorted[:-1]]) if len(key) else by_key
    groups = key_sorted[starts]
    sums = np.add.reduceat(w_sorted, starts) if len(key) else w_sorted
    longest_w = np.maximum.reduceat(w_sorted, starts) if len(key) else w_sorted
    group_of = np.repeat(np.arange(len(groups)), np.diff(np.r_[starts, len(key)]))
    is_max = np.flatnonzero(w_sorted == longest_w[group_of])  # per group its longest edge, the first
    firsts = is_max[np.r_[True, group_of[is_max][1:] != group_of[is_max][:-1]]] if len(is_max) else is_max
    event_of = np.full(len(groups), -1, dtype=np.int64)
    event_of[group_of[firsts]] = graph.owner[path[by_key[firsts]]]
    g_piece, g_pair = groups // span, groups % span
    order = np.lexsort((g_pair, -sums, g_piece))  # per piece, largest first (ties: the lower pair)
    rank = np.arange(len(order)) - np.searchsorted(g_piece[order], g_piece[order])
    top = order[(rank < TOP_CONTRIBUTORS) & (sums[order] > 0)]
    found: list[tuple[list[Contributor], list[int]]] = [([], []) for _ in range(len(lengths))]
    for g, p, pr, us in zip(top.tolist(), g_piece[top].tolist(), g_pair[top].tolist(), sums[top].tolist(),
                            strict=True):
        found[p][0].append(Contributor(names[pr // n_cat], cat.CATEGORIES[pr % n_cat], round(us, 3)))
        found[p][1].append(int(event_of[g]))
    rows = by_cat.reshape(len(lengths), n_cat).tolist()
    by_phase: list[list[float]] = [[] for _ in range(len(lengths))]
    if phases is not None:
        n_ph = len(FSDP2_STEP_PHASES)
        summed = np.bincount(piece * n_ph + phases[path], weights=weight, minlength=len(lengths) * n_ph)
        by_phase = [[round(x, 3) for x in row] for row in summed.reshape(len(lengths), n_ph).tolist()]
    return [(Piece([round(x, 3) for x in row], contributors, phase_row), events)
            for row, (contributors, events), phase_row in zip(rows, found, by_phase, strict=True)]


def _with_sites(piece: Piece, events: list[int], sites: dict[int, str | None]) -> Piece:
    top = [msgspec.structs.replace(c, site=sites.get(e)) if c.name != BETWEEN else c
           for c, e in zip(piece.top, events, strict=True)]
    return msgspec.structs.replace(piece, top=top)


def _pieces(graph: LocalGraph, small: Contracted, run: Replay, on_path: np.ndarray,
            phases: np.ndarray | None = None) -> tuple[list[Piece | None], list[Piece]]:
    """The measured paths into every arrival and step end (``run``: the measured replay of the
    contracted graph), with call sites when recorded (their edges marked in ``on_path``), by FSDP2
    phase with ``phases``."""
    target = small.graph
    arrivals = target.arrival.tolist()
    nodes = [int(a) for a in arrivals if a >= 0] + [s.end for s in target.steps]
    made = _pieces_of(graph, small, run, nodes, on_path, phases)
    if has_stacks(graph.trace):
        wanted = sorted({e for _, events in made for e in events if e >= 0})
        sites = dict(zip(wanted, call_sites(graph.trace, np.array(wanted, dtype=np.int64)), strict=True))
        made = [(_with_sites(piece, events, sites), events) for piece, events in made]
    pieces = iter(piece for piece, _ in made)
    found = [next(pieces) if a >= 0 else None for a in arrivals]
    return found, list(pieces)


def paths_of(graph: LocalGraph, causes: Sequence[str] = tuple(CAUSES)) -> RankPaths:
    """The :class:`RankPaths` of a built graph (the measured replay and one per cause it has)."""
    base = graph.base_us
    small = contract(graph)
    target = small.graph
    measured = replay(target, small.weights(graph.weight), None, small.work(graph.weight, graph))
    arrivals, ends = _sink_tables(target, measured)
    all_arrivals, all_ends = {MEASURED: arrivals}, {MEASURED: ends}
    on_path = np.zeros(len(graph.src), dtype=bool)
    tags = fsdp_tags(graph)
    pieces, step_pieces = _pieces(graph, small, measured, on_path, tags[0] if tags else None)
    del measured  # the what-ifs' replays come one at a time, each released before the next
    for cause in causes:
        change = cause_change(graph, cause)
        if change is not None and _matters(graph, change, on_path):
            all_arrivals[cause], all_ends[cause] = tables(graph, change, small)
        del change
    t = graph.t
    return RankPaths(
        format=formats.PATHS.version, rank=graph.trace.rank, world_size=graph.trace.world_size,
        window_us=float(t[graph.window_node]) + base if graph.window_node >= 0 else base,
        steps=[PathStep(s.name, float(t[s.start]) + base, float(t[s.end]) + base) for s in graph.steps],
        collectives=CompactRecords.of(graph.records),
        completion_us=[float(t[c]) + base if c >= 0 else None for c in graph.completion.tolist()],
        arrivals=all_arrivals, step_ends=all_ends, pieces=pieces, step_pieces=step_pieces,
        notes=list(graph.notes), host=origin(graph.trace).host, record_phases=tags[1] if tags else [])


def _matters(graph: LocalGraph, change: Change, on_path: np.ndarray) -> bool:
    """Whether a what-if can change a sink: it lightens or cuts an edge on a sink's binding path
    (lightening or cutting any other edge leaves every sink's best path as it was), or frees a
    completion where a waiting thread resumed."""
    weight, cut = change
    touched = (weight != graph.weight) | cut
    return bool((touched & on_path).any() or (cut & (graph.kind == WAIT)).any())


def rank_paths(trace: Trace) -> RankPaths:
    """One rank's reduced graph (what the summary sidecar keeps).

    Args:
        trace: one rank's trace, loaded with ``comms=True`` (without, the rank has no collectives:
            its path is its own).

    Returns:
        The rank's :class:`RankPaths`.
    """
    return paths_of(local_graph(trace))
