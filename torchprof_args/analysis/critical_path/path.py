"""The critical path of each step, read off the cycle's graph replayed as measured
(:func:`step_paths`), and the document ``torchprof critical-path --json`` prints
(:class:`CriticalPathDoc`).

A step's path is the chain of binding dependencies back from the end of the step on its *reference*
rank (the rank whose step was longest) to that step's start: within a rank, the binding path of its
reduced graph between two collectives (:class:`~.reduced.Piece`: time by category, top
contributors); at a collective, the transfer once the last rank arrived, then back on that last
rank.  Every edge of the graph carries the measured delay of what bound its destination, so the
path is as long as the step (its time by category, and on FSDP2's ranks by FSDP2 phase, adds up
to it); where it is not (the path reached a rank's first step, which started
after the reference rank's step did) the difference is printed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment
from torchprof_args.analysis.analyzers.fsdp import FSDP2_STEP_PHASES, OUTSIDE_FSDP
from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.cycle import A, CycleGraph, E, J, Replayed, T
from torchprof_args.analysis.critical_path.reduced import Piece

__all__ = ["PATH_VERSION", "CriticalPathDoc", "Segment", "StepPath", "TopEntry", "WhatIfAnswer", "step_paths",
           "top_entries"]

#: the ``version`` of ``torchprof critical-path --json`` (bumped on any incompatible change).
PATH_VERSION = 1


class Segment(msgspec.Struct, frozen=True):
    """A stretch of a step's path on one rank (ms from the step's start), with its main category."""

    rank: int
    start_ms: float
    end_ms: float
    category: str


class StepPath(msgspec.Struct, frozen=True):
    """One step's critical path.

    Attributes:
        step: the step's name.
        rank: the reference rank (whose step was the longest).
        step_ms: that rank's step.
        path_ms: the path's length (equal to ``step_ms`` where the path reaches the step's start).
        difference_ms: ``path_ms - step_ms``.
        by_rank: the path's time on each rank (ms).
        by_category: the path's time by category (ms, :data:`~.categories.CATEGORIES`).
        segments: the path, rank by rank, in time order.
        by_phase: on an FSDP2 job, the path's time by FSDP2 phase (ms,
            :data:`~..analyzers.fsdp.FSDP2_STEP_PHASES`): what each edge is attributed to, by the
            innermost ``FSDP::`` annotation around it (a transfer: its collective's); empty otherwise.
    """

    step: str
    rank: int
    step_ms: float
    path_ms: float
    difference_ms: float
    by_rank: dict[str, float]
    by_category: dict[str, float]
    segments: list[Segment]
    by_phase: dict[str, float] = {}


class TopEntry(msgspec.Struct, frozen=True):
    """An operator or kernel on the path: its rank, name, category, ms per step, Python call site."""

    rank: int
    name: str
    category: str
    ms_per_step: float
    site: str | None = None


class WhatIfAnswer(msgspec.Struct, frozen=True):
    """A what-if: the question, the step the graph predicts, what it saves, how it was computed."""

    spec: str
    step_ms: float | None
    saving_ms_per_step: float | None
    how: str


class CriticalPathDoc(msgspec.Struct, frozen=True):
    """``torchprof critical-path --json`` (docs/guides/critical-path.md).

    Attributes:
        version: :data:`PATH_VERSION`.
        path: the path given.
        cycle: which cycle (``iterations A-B``), or None.
        ranks: how many ranks' traces the graph joins.
        step_ms: the job's step: the slowest rank's mean step.
        steps: each step's path.
        top: the operators and kernels with the most time on the path, per step.
        what_if: the answers to ``--what-if``.
        notes: what the graph could not use.
        clock: the hosts' clocks (:class:`~..analyzers.clocks.ClockAlignment`): on several hosts, every
            time was put on the first rank's host's clock before the ranks were joined.
    """

    version: int
    path: str
    cycle: str | None
    ranks: int
    step_ms: float | None
    steps: list[StepPath]
    top: list[TopEntry]
    what_if: list[WhatIfAnswer]
    notes: list[str]
    clock: ClockAlignment | None = None


def _piece(graph: CycleGraph, node: int) -> Piece | None:
    part = graph.parts[graph.rank[node]]
    index = graph.index[node]
    return part.pieces[index] if graph.kind[node] == A else part.step_pieces[index]


_PHASES = tuple(FSDP2_STEP_PHASES)


def _phases(graph: CycleGraph, node: int, length: float, piece: Piece | None,
            scale: float) -> dict[str, float]:
    """The FSDP2 phases (ms) of the ``length`` ms of the path into ``node`` (empty: its rank is not
    FSDP2's): a piece's, scaled as its categories are; a transfer, its collective's."""
    part = graph.parts[graph.rank[node]]
    if not part.record_phases:
        return {}
    if graph.kind[node] == E:
        return {_PHASES[part.record_phases[graph.index[node]]]: length}
    if piece is not None and piece.by_phase and scale > 0:
        return {name: us / 1e3 * scale for name, us in zip(_PHASES, piece.by_phase, strict=True) if us > 0}
    return {_PHASES[OUTSIDE_FSDP]: length}


def _segment(graph: CycleGraph, node: int, length: float, top: dict[tuple[int, str, str, str | None], float]
             ) -> tuple[dict[str, float], str, dict[str, float]]:
    """The categories (ms) of the ``length`` ms of the path into ``node`` kept in the step, adding
    its contributors to ``top``; its main category; and its FSDP2 phases (ms, empty off FSDP2)."""
    kind = graph.kind[node]
    if kind in (A, T):
        piece = _piece(graph, node)
        if piece is not None and sum(piece.by_category) > 0:
            scale = length / (sum(piece.by_category) / 1e3)
            for c in piece.top:
                top[(graph.rank[node], c.name, c.category, c.site)] += c.us / 1e3 * scale
            found = {name: us / 1e3 * scale
                     for name, us in zip(cat.CATEGORIES, piece.by_category, strict=True) if us > 0}
            return found, max(found, key=found.__getitem__), _phases(graph, node, length, piece, scale)
        name = cat.CATEGORIES[cat.CPU_ONLY]
        return {name: length}, name, _phases(graph, node, length, None, 0.0)
    if kind == E:
        name = cat.CATEGORIES[cat.COMMUNICATION]
        return {name: length}, name, _phases(graph, node, length, None, 0.0)
    return {}, cat.CATEGORIES[cat.WAIT_RANK], {}


def _moved(graph: CycleGraph, replayed: Replayed, rank: int, step: int) -> float:
    """How far the replay moved the end of ``rank``'s step ``step`` (0 for none: the window's start)."""
    if step < 0:
        return 0.0
    node = graph.nodes[(T, rank, step)]
    return replayed.time[node] - graph.measured[node]


def step_paths(graph: CycleGraph, replayed: Replayed, top: dict[tuple[int, str, str, str | None], float],
               notes: list[str] | None = None) -> list[StepPath]:
    """Every step's path in ``replayed`` (the graph as measured), adding contributors to ``top``
    (and to ``notes`` a step whose path starts where another rank's trace begins)."""
    steps = max((len(p.steps) for p in graph.parts.values()), default=0)
    out = []
    for n in range(steps):
        spans = {r: p.steps[n] for r, p in graph.parts.items() if n < len(p.steps)}
        # each rank's step in the replay: its span, moved as far as the replay moved its ends
        ends = {r: replayed.time[graph.nodes[(T, r, n)]] for r in spans}
        starts = {r: spans[r].start_us + _moved(graph, replayed, r, n - 1) for r in spans}
        ref = max(sorted(spans), key=lambda r: ends[r] - starts[r])
        start = starts[ref]
        node = graph.nodes[(T, ref, n)]
        by_rank: dict[str, float] = defaultdict(float)
        by_cat: dict[str, float] = defaultdict(float)
        by_phase: dict[str, float] = defaultdict(float)
        segments = []
        for _ in range(len(graph.kind)):
            pred = replayed.binding[node]
            if pred < 0:
                if notes is not None and replayed.time[node] > start + 1.0:
                    notes.append(f"{spans[ref].name}: the path starts where rank {graph.rank[node]}'s trace "
                                 f"begins, {(replayed.time[node] - start) / 1e3:.1f} ms into the step (its "
                                 "previous step is not in the trace): the path is that much shorter")
                break
            t0, t1 = replayed.time[pred], replayed.time[node]
            lo = max(t0, start)
            found, main, phases = _segment(graph, node, max(t1 - lo, 0.0) / 1e3, top)
            if t1 > lo and graph.kind[node] != J:
                rank = graph.rank[node]
                by_rank[str(rank)] += (t1 - lo) / 1e3
                segments.append(Segment(rank, round((lo - start) / 1e3, 3), round((t1 - start) / 1e3, 3),
                                        main))
            for name, ms in found.items():
                by_cat[name] += ms
            for name, ms in phases.items():
                by_phase[name] += ms
            if t0 <= start:
                break
            node = pred
        step_ms = (ends[ref] - start) / 1e3
        path_ms = sum(by_rank.values())
        out.append(StepPath(
            step=spans[ref].name, rank=ref, step_ms=round(step_ms, 3), path_ms=round(path_ms, 3),
            difference_ms=round(path_ms - step_ms, 3),
            by_rank={k: round(v, 3) for k, v in sorted(by_rank.items())},
            by_category={c: round(by_cat[c], 3) for c in cat.CATEGORIES if by_cat.get(c)},
            segments=segments[::-1], by_phase={p: round(by_phase[p], 3) for p in _PHASES if by_phase.get(p)}))
    return out


def top_entries(top: dict[tuple[int, str, str, str | None], float], steps: int,
                limit: int = 10) -> list[TopEntry]:
    """The ``limit`` contributors with the most time on the path, per step."""
    ranked = sorted(top.items(), key=lambda kv: -kv[1])[:limit]
    return [TopEntry(rank, name, category, round(ms / max(steps, 1), 3), site)
            for (rank, name, category, site), ms in ranked if ms > 0]


def as_json(doc: CriticalPathDoc) -> dict[str, Any]:
    """``doc`` as plain JSON values."""
    return msgspec.to_builtins(doc)
