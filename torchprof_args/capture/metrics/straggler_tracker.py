"""Which rank is slow: per-interval straggler figures from the timers' readings of every rank.

The per-interval gather already holds every rank's seconds for every timer, so finding the slow
rank costs no communication:

* ``timers/<name>-time-max-rank``: the global rank with the largest reading of each timer;
* a straggler score per rank for the timers that matter most (``--straggler-timers``, default
  forward-backward, optimizer and the step): its time over the median of the other ranks
  (:mod:`torchprof_args.shared.stragglers`, the one definition), written per rank to
  ``metrics.jsonl`` (the dashboard's rank x interval heatmap) with the largest score and its rank
  as scalars (``stragglers/<name>-score-max``, ``stragglers/<name>-score-max-rank``);
* a one-line warning on global rank 0 when one rank stays a straggler (its score at least
  ``--straggler-threshold``, its time 2 ms over the others' median) for ``--straggler-intervals``
  intervals in a row, with the rank's megatron-core parallel coordinates when its parallel state
  is up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from torchprof_args.capture.metrics.hardware import hardware_reason
from torchprof_args.log import get_logger
from torchprof_args.shared.stragglers import is_straggler, others_medians, straggler_score

__all__ = ["DEFAULT_STRAGGLER_TIMERS", "StragglerTracker", "straggler_figures"]

logger = get_logger(__name__)

#: Megatron-LM's names for the timers that matter most: the step (``interval-time``; ``step``
#: elsewhere), forward-backward and the optimizer.
DEFAULT_STRAGGLER_TIMERS = ("forward-backward", "optimizer", "interval-time", "step")


def _finite(values: Sequence[float]) -> list[tuple[int, float]]:
    return [(rank, value) for rank, value in enumerate(values) if value is not None and math.isfinite(value)]


def straggler_figures(names: Sequence[str], times: Sequence[Sequence[float]], global_ranks: Sequence[int],
                      scored: Sequence[str]) -> tuple[dict[str, float], dict[str, list[float | None]]]:
    """``(scalars, per_rank)`` of one interval; ``times[r][i]`` is group rank r's seconds for ``names[i]``.

    Nothing for a timer fewer than two ranks ran.  Scores are only computed for ``scored`` timers
    (the others' median of zero gives no score).
    """
    scalars: dict[str, float] = {}
    per_rank: dict[str, list[float | None]] = {}
    for index, name in enumerate(names):
        readings = _finite([row[index] for row in times])
        if len(readings) < 2:
            continue
        slowest, _ = max(readings, key=lambda item: item[1])
        scalars[f"timers/{name}-time-max-rank"] = float(global_ranks[slowest])
        if name not in scored:
            continue
        scores: list[float | None] = [None] * len(times)
        for (rank, value), others in zip(readings, others_medians([v for _, v in readings]), strict=True):
            scores[rank] = straggler_score(value, others)
        if all(score is None for score in scores):
            continue
        per_rank[f"stragglers/{name}-score"] = scores
        top_rank, top = max(((r, s) for r, s in enumerate(scores) if s is not None), key=lambda item: item[1])
        scalars[f"stragglers/{name}-score-max"] = top
        scalars[f"stragglers/{name}-score-max-rank"] = float(global_ranks[top_rank])
    return scalars, per_rank


@dataclasses.dataclass
class _Streak:
    count: int
    first_iteration: int


def _coordinates_text(coordinates: Mapping[str, int] | None) -> str:
    if not coordinates:
        return ""
    return " (" + " ".join(f"{axis}={index}" for axis, index in coordinates.items()) + ")"


class StragglerTracker:
    """Counts, per scored timer, the intervals in a row each rank has been a straggler (its score
    at least ``threshold``, its time 2 ms over the others' median:
    :func:`torchprof_args.shared.stragglers.is_straggler`);
    warns (global rank 0 only) when a streak reaches ``intervals``, then at 2x, 4x, 8x ... that
    length while it lasts (a persistent straggler is not repeated every interval).

    ``threshold`` 0 turns the warnings off (the figures are still written).
    """

    def __init__(self, threshold: float, intervals: int, *, rank: int) -> None:
        self.threshold = threshold
        self.intervals = max(1, intervals)
        self.rank = rank
        self._streaks: dict[tuple[str, int], _Streak] = {}
        self._last_iteration: dict[str, int] = {}
        #: Warnings issued so far (every rank computes them; only rank 0 logs them).
        self.warnings: list[str] = []

    def update(self, iteration: int, names: Sequence[str], times: Sequence[Sequence[float]],
               per_rank: Mapping[str, Sequence[float | None]], global_ranks: Sequence[int],
               coordinates: Sequence[Mapping[str, int] | None] | None = None,
               hardware: Sequence[Mapping[str, float] | None] | None = None) -> list[str]:
        """Fold in one interval's scores (a timer already seen at ``iteration`` is skipped);
        returns the warnings of this interval.  ``hardware[r]`` is group rank r's per-rank figures:
        its ``gpu/`` readings say why a rank is slow (:func:`~.hardware.hardware_reason`)."""
        if self.threshold <= 0:
            return []
        issued: list[str] = []
        for key, scores in per_rank.items():
            name = key[len("stragglers/") : -len("-score")]
            if self._last_iteration.get(name) == iteration:
                continue
            self._last_iteration[name] = iteration
            index = list(names).index(name)
            ran = sum(1 for row in times if row[index] is not None and math.isfinite(row[index]))
            for rank, score in enumerate(scores):
                streak_key = (name, global_ranks[rank])
                mine_ms = times[rank][index] * 1e3 if score else 0.0
                if not score or not is_straggler(mine_ms, mine_ms / score, self.threshold):
                    self._streaks.pop(streak_key, None)
                    continue
                streak = self._streaks.setdefault(streak_key, _Streak(0, iteration))
                streak.count += 1
                repeats, rest = divmod(streak.count, self.intervals)
                if rest == 0 and repeats & (repeats - 1) == 0:
                    coords = coordinates[rank] if coordinates else None
                    why = hardware_reason(hardware, rank) if hardware else ""
                    issued.append(
                        f"straggler: rank {global_ranks[rank]}{_coordinates_text(coords)} {name} took "
                        f"{score:.2f}x the median of the other ranks "
                        f"({mine_ms:.1f} ms vs {mine_ms / score:.1f} ms; {ran} ranks) "
                        f"for {streak.count} log intervals in a row "
                        f"(iterations {streak.first_iteration}-{iteration}; "
                        f"--straggler-threshold {self.threshold:g})"
                        + (f"; rank {global_ranks[rank]}: {why}" if why else ""))
        if self.rank == 0:
            for line in issued:
                logger.warning(line)
        self.warnings += issued
        return issued

