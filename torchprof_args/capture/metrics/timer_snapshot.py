"""Timer readings across ranks: :class:`TimerSnapshot` (every rank's seconds per timer name, from
one collective) and its Megatron-style reports, the ``timers/<name>-time`` scalars and the text
report in milliseconds.

:mod:`~torchprof_args.capture.metrics.timers` takes the snapshots (and re-exports these names); this
module needs neither torch nor a process group.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

__all__ = ["TimerSnapshot", "format_snapshot", "timer_scalars"]


@dataclasses.dataclass
class TimerSnapshot:
    """Timer readings of every rank from one collective.

    ``times[r][i]`` is group rank ``r``'s seconds for ``names[i]`` (NaN where that rank did not
    run the timer); ``per_rank[r]`` is the figures rank ``r`` sent along (or ``None``);
    ``global_ranks[r]`` its global rank and ``coordinates[r]`` its megatron-core parallel
    coordinates (None when megatron-core's parallel state was not up).
    """

    names: list[str]
    times: list[list[float]]
    per_rank: list[dict[str, float] | None]
    global_ranks: list[int] | None = None
    coordinates: list[Mapping[str, int] | None] | None = None

    @property
    def world_size(self) -> int:
        return len(self.times)

    def rank_times(self, name: str) -> list[float]:
        """Seconds of ``name`` on each rank (NaN where it did not run)."""
        index = self.names.index(name)
        return [row[index] for row in self.times]

    def min_max(self, normalizer: float = 1.0) -> dict[str, tuple[float, float]]:
        """``name -> (min, max)`` seconds across the ranks that ran it, divided by ``normalizer``."""
        result: dict[str, tuple[float, float]] = {}
        for index, name in enumerate(self.names):
            values = [row[index] for row in self.times if not math.isnan(row[index])]
            if values:
                result[name] = (min(values) / normalizer, max(values) / normalizer)
        return result


def timer_scalars(min_max: dict[str, tuple[float, float]], log_option: str) -> dict[str, float]:
    """Megatron-style keys: ``timers/<name>-time`` (max) and, unless ``max``, ``-time-min``."""
    scalars: dict[str, float] = {}
    for name, (low, high) in min_max.items():
        scalars[f"timers/{name}-time"] = high
        if log_option != "max":
            scalars[f"timers/{name}-time-min"] = low
    return scalars


def format_snapshot(snapshot: TimerSnapshot, log_option: str, normalizer: float = 1.0) -> str | None:
    """Megatron's text report of a snapshot, in milliseconds."""
    scale = 1000.0 / normalizer
    if log_option == "all":
        lines = ["times across ranks (ms):"]
        for index, name in enumerate(snapshot.names):
            rows = [
                f"     rank {rank:2d}: {row[index] * scale:.2f}"
                for rank, row in enumerate(snapshot.times)
                if not math.isnan(row[index])
            ]
            if rows:
                lines.append(f"  {name}:")
                lines += rows
        return "\n".join(lines) if len(lines) > 1 else None
    min_max = snapshot.min_max(normalizer / 1000.0)
    if not min_max:
        return None
    if log_option == "max":
        lines = ["max time across ranks (ms):"]
        lines += [f"    {(name + ' ').ljust(48, '.')}: {high:.2f}" for name, (_, high) in min_max.items()]
    else:
        lines = ["(min, max) time across ranks (ms):"]
        lines += [
            f"    {(name + ' ').ljust(48, '.')}: ({low:.2f}, {high:.2f})"
            for name, (low, high) in min_max.items()
        ]
    return "\n".join(lines)
