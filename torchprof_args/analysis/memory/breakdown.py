"""One device's allocations over a window -> its memory breakdown (:class:`~.categories.DeviceMemory`).

Both sources of categories (PyTorch's profiler, :mod:`.pytorch_profile`; the trace,
:mod:`.trace_memory`) and the allocator history of a snapshot (:mod:`.snapshot_history`) reduce to
the same table, :class:`Allocations`: one row per allocation with its lifetime, size, category and
where it was made.  :func:`breakdown` replays it in time order (vectorised: one cumulative sum per
category), finds the peak, what was live then, each step's peak, the tensors kept across steps,
and a timeline small enough for a sidecar.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from torchprof_args.analysis.memory.categories import (
    ACTIVATION,
    GRADIENT,
    MEMORY_CATEGORIES,
    OPTIMIZER_STATE,
    PARAMETER,
    ByCategory,
    DeviceMemory,
    Moment,
    Retained,
    Site,
    StepMemory,
    Timeline,
)

__all__ = ["BEFORE_WINDOW", "TIMELINE_POINTS", "Allocations", "Where", "breakdown", "step_of"]

#: points kept in a timeline.
TIMELINE_POINTS = 240
#: allocation sites listed at the peak.
TOP_SITES = 10
#: the site of memory allocated before the window (no event says where).
BEFORE_WINDOW = "(allocated before the window)"
#: categories that live across steps by design (never "retained").
_PERSISTENT = (PARAMETER, GRADIENT, OPTIMIZER_STATE)


class Where(NamedTuple):
    """Where an allocation was made: phase, innermost operator, module and call site."""

    phase: str
    op: str | None = None
    module: str | None = None
    site: str | None = None


@dataclass
class Allocations:
    """One device's allocations in a window, one row each (numpy columns).

    ``start`` is -inf for memory allocated before the window, ``end`` +inf for memory still held at
    its end; times are microseconds on the trace's clock.  ``where[k]`` is row ``k``'s
    :class:`Where` as an index into ``places``.  ``steps`` are the window's ``(name, start, end)``.
    """

    device: str
    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    category: np.ndarray
    where: np.ndarray
    places: list[Where]
    window: tuple[float, float]
    steps: list[tuple[str, float, float]] = field(default_factory=list)
    #: the allocator's highest reservation in the window (CUDA), None when not recorded.
    peak_reserved: int | None = None

    def __len__(self) -> int:
        return len(self.size)


class _Replay(NamedTuple):
    """The allocations' events in time order and the live bytes per category after each."""

    times: np.ndarray
    row: np.ndarray
    is_alloc: np.ndarray
    live: np.ndarray  # (categories, events)
    total: np.ndarray


def _replay(allocs: Allocations) -> _Replay:
    n = len(allocs)
    freed = np.flatnonzero(np.isfinite(allocs.end))
    start = np.where(np.isfinite(allocs.start), allocs.start, allocs.window[0])
    times = np.concatenate([start, allocs.end[freed]])
    row = np.concatenate([np.arange(n), freed])
    is_alloc = np.r_[np.ones(n, bool), np.zeros(len(freed), bool)]
    # time order; at equal times frees first, allocations made before the window first of all
    first = np.r_[~np.isfinite(allocs.start), np.zeros(len(freed), bool)]
    order = np.lexsort((is_alloc, ~first, times))
    times, row, is_alloc = times[order], row[order], is_alloc[order]
    delta = np.where(is_alloc, allocs.size[row], -allocs.size[row])
    cats = allocs.category[row]
    live = np.zeros((len(MEMORY_CATEGORIES), len(times)), dtype=np.int64)
    for c in range(len(MEMORY_CATEGORIES)):
        np.cumsum(np.where(cats == c, delta, 0), out=live[c])
    return _Replay(times, row, is_alloc, live, live.sum(axis=0))


def breakdown(allocs: Allocations) -> DeviceMemory | None:
    """The memory breakdown of one device's allocations; None when there are none."""
    if not len(allocs):
        return None
    replay = _replay(allocs)
    peak = int(np.argmax(replay.total))
    alloc_pos = np.empty(len(allocs), dtype=np.int64)
    free_pos = np.full(len(allocs), len(replay.times), dtype=np.int64)
    alloc_pos[replay.row[replay.is_alloc]] = np.flatnonzero(replay.is_alloc)
    free_pos[replay.row[~replay.is_alloc]] = np.flatnonzero(~replay.is_alloc)
    live_at_peak = (alloc_pos <= peak) & (free_pos > peak)
    in_backward = np.array([p.phase == "backward" for p in allocs.places] + [False], dtype=bool)
    backward = in_backward[allocs.where]  # each allocation: made in a backward pass
    return DeviceMemory(
        device=allocs.device,
        peak_bytes=int(replay.total[peak]),
        peak=_moment(allocs, replay, peak),
        by_category=ByCategory.of(replay.live[:, peak]),
        category_peaks=ByCategory.of(replay.live.max(axis=1)),
        top_sites=_sites(allocs, np.flatnonzero(live_at_peak)),
        steps=[s for s in (_step(allocs, replay, backward, *step) for step in allocs.steps) if s is not None],
        retained=_retained(allocs),
        timeline=_timeline(allocs, replay),
        start_bytes=int(allocs.size[~np.isfinite(allocs.start)].sum()),
        end_bytes=int(replay.total[-1]),
        peak_reserved_bytes=allocs.peak_reserved,
    )


def step_of(steps: list[tuple[str, float, float]], ts: float) -> tuple[str, float] | None:
    """The step ``ts`` falls in and its start; None when it falls in none."""
    for name, start, end in steps:
        if start <= ts < end:
            return name, start
    return None


def _moment(allocs: Allocations, replay: _Replay, index: int) -> Moment:
    ts = float(replay.times[index])
    place = allocs.places[int(allocs.where[replay.row[index]])] if replay.is_alloc[index] else Where("other")
    found = step_of(allocs.steps, ts)
    return Moment(ts_us=ts, step=found[0] if found else None,
                  ms_into_step=round((ts - found[1]) / 1e3, 3) if found else None,
                  phase=place.phase, op=place.op, module=place.module, site=place.site)


def _sites(allocs: Allocations, rows: np.ndarray, top: int = TOP_SITES) -> list[Site]:
    """The largest call sites among ``rows``, each with its bytes and blocks of one category (a
    site whose blocks are of several categories, such as the memory held before the window, is one
    entry per category: every figure is its category's)."""
    sizes: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for row in rows.tolist():
        site = allocs.places[int(allocs.where[row])].site or (
            BEFORE_WINDOW if allocs.start[row] == -np.inf else "<unknown>")
        entry = sizes[(site, int(allocs.category[row]))]
        entry[0] += int(allocs.size[row])
        entry[1] += 1
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1][0])[:top]
    return [Site(site, v[0], v[1], MEMORY_CATEGORIES[category]) for (site, category), v in ranked]


def _step(allocs: Allocations, replay: _Replay, backward: np.ndarray, name: str, start: float,
          end: float) -> StepMemory | None:
    lo, hi = np.searchsorted(replay.times, [start, end])
    if hi <= lo:
        return None
    peak = lo + int(np.argmax(replay.total[lo:hi]))
    before = int(replay.total[lo - 1]) if lo else int(allocs.size[~np.isfinite(allocs.start)].sum())
    first = np.flatnonzero(replay.is_alloc[lo:hi] & backward[replay.row[lo:hi]])
    kept = int(replay.live[ACTIVATION, lo + int(first[0]) - 1]) if len(first) and lo + int(first[0]) else None
    return StepMemory(step=name, peak_bytes=int(replay.total[peak]),
                      phase=_moment(allocs, replay, peak).phase,
                      by_category=ByCategory.of(replay.live[:, peak]), start_bytes=before,
                      end_bytes=int(replay.total[hi - 1]), activations_for_backward_bytes=kept)


def _retained(allocs: Allocations) -> list[Retained]:
    """Sites whose allocations of two or more steps are all still held at the window's end (not
    parameters, gradients or optimizer state, which live across steps by design)."""
    if len(allocs.steps) < 2:
        return []
    held = np.flatnonzero(~np.isfinite(allocs.end) & np.isfinite(allocs.start)
                          & ~np.isin(allocs.category, _PERSISTENT))
    last = allocs.steps[-1][0]
    by_site: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row in held.tolist():
        found = step_of(allocs.steps, float(allocs.start[row]))
        if found is not None:
            site = allocs.places[int(allocs.where[row])].site or "<unknown>"
            by_site[site][found[0]].append(row)
    out = []
    for site, steps in by_site.items():
        earlier = [rows for step, rows in steps.items() if step != last]
        if len(steps) < 2 or not earlier:
            continue
        rows = np.array([r for step_rows in earlier for r in step_rows])
        kept = int(allocs.size[rows].sum())
        weights = np.bincount(allocs.category[rows], weights=allocs.size[rows])
        category = MEMORY_CATEGORIES[int(weights.argmax())]
        out.append(Retained(site=site, bytes=kept, per_step_bytes=kept // len(earlier), steps=len(steps),
                            category=category))
    return sorted(out, key=lambda r: -r.bytes)


def _timeline(allocs: Allocations, replay: _Replay, points: int = TIMELINE_POINTS) -> Timeline:
    """At most ``points`` moments: in each slice of the window, its highest."""
    t0, t1 = allocs.window
    times = replay.times
    if len(times) <= points or t1 <= t0:
        keep = np.arange(len(times))
    else:
        edges = np.searchsorted(times, np.linspace(t0, t1, points + 1)[1:-1])
        keep_list = []
        for lo, hi in zip(np.r_[0, edges], np.r_[edges, len(times)], strict=True):
            if hi > lo:
                keep_list.append(lo + int(np.argmax(replay.total[lo:hi])))
        keep = np.array(keep_list, dtype=np.int64)
    return Timeline(start_us=float(t0), t_ms=[round((float(t) - t0) / 1e3, 3) for t in times[keep]],
                    by_category={name: replay.live[c, keep].tolist()
                                 for c, name in enumerate(MEMORY_CATEGORIES)})
