"""How much CPU this job's node left idle over a stretch of training: whether a publication in the
background would find an idle core, or take its CPU time from the training steps.

The trace writer marks an :class:`IdleCpuProbe` when it starts and after each flush, and reads it
at the next flush (:func:`node_was_busy`).  The figure is the average number of idle cores over
that stretch (the steps between two windows, and the window itself):

* under a cgroup v2 CPU quota (``cpu.max``, a container's CPU limit), the quota's cores less the
  cgroup's own use (``cpu.stat`` ``usage_usec``): the host's other cores are not the job's;
* else the idle and I/O-wait time of ``/proc/stat`` over the CPUs this process may run on
  (``sched_getaffinity``).

A few small files, read twice per window.  Import-light: no torch.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from torchprof_args.capture.runtime.host_resources import (
    cgroup_stat_value,
    cgroup_v2_directories,
    local_world_size,
)
from torchprof_args.log import get_logger

__all__ = ["IdleCpuProbe", "node_was_busy"]

logger = get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class _Reading:
    wall: float
    #: under a quota: the cgroup's CPU seconds; else 0.
    used: float
    #: /proc/stat: idle and all ticks, summed over the usable CPUs; else 0.
    idle_ticks: int
    all_ticks: int


class IdleCpuProbe:
    """Idle cores, on average, between :meth:`mark` and :meth:`idle_cores`.

    ``proc`` exists so that tests can point the probe at a prepared tree.
    """

    def __init__(self, proc: str | os.PathLike[str] = "/proc") -> None:
        self._stat = Path(proc) / "stat"
        if hasattr(os, "sched_getaffinity"):
            cpus = os.sched_getaffinity(0)
        else:  # not Linux: every CPU
            cpus = set(range(os.cpu_count() or 1))
        self._cpus = {f"cpu{n}" for n in cpus}
        #: (the cgroup whose ``cpu.stat`` counts the job, the cores its quota allows) or None.
        self._quota = _tightest_quota(cgroup_v2_directories(proc), len(self._cpus))
        self._mark: _Reading | None = None

    @property
    def source(self) -> str:
        """Where the figure comes from (for log lines)."""
        return f"the CPU quota of {self._quota[0]}" if self._quota else "/proc/stat"

    def mark(self) -> None:
        """Start a stretch now."""
        self._mark = self._read()

    def idle_cores(self) -> float | None:
        """Cores left idle on average since :meth:`mark`; None without a mark or a readable source."""
        start, end = self._mark, self._read()
        if start is None or end is None or end.wall <= start.wall:
            return None
        if self._quota is not None:
            return max(0.0, self._quota[1] - (end.used - start.used) / (end.wall - start.wall))
        ticks = end.all_ticks - start.all_ticks
        if ticks <= 0:
            return None
        return len(self._cpus) * (end.idle_ticks - start.idle_ticks) / ticks

    def _read(self) -> _Reading | None:
        now = time.monotonic()
        if self._quota is not None:
            used = _usage_seconds(self._quota[0])
            return None if used is None else _Reading(now, used, 0, 0)
        try:
            lines = self._stat.read_text().splitlines()
        except OSError:
            return None
        idle = total = 0
        for line in lines:
            fields = line.split()
            if not fields or fields[0] not in self._cpus:
                continue
            try:  # user nice system idle iowait irq softirq steal
                ticks = [int(v) for v in fields[1:9]]
                idle += ticks[3] + ticks[4]
            except (ValueError, IndexError):
                return None  # not the format this reads: no figure, no guess
            total += sum(ticks)
        return _Reading(now, 0.0, idle, total) if total else None


def node_was_busy(probe: IdleCpuProbe, rank: int, what: str) -> bool:
    """Whether the node left fewer cores idle since ``probe``'s mark than it has ranks (a publisher
    each, at worst all at once): then a publication in the background would take its CPU time from
    the training steps.  False when the figure cannot be read.  ``what``: the trace, for the log."""
    idle = probe.idle_cores()
    ranks = local_world_size()
    busy = idle is not None and idle < ranks
    logger.debug("rank %d: %s idle cores since the last flush (%s), %d rank(s) on the node: %s %s", rank,
                 "unknown" if idle is None else f"{idle:.2f}", probe.source, ranks,
                 "waiting for" if busy else "publishing in the background", what)
    return busy


def _tightest_quota(directories: list[Path], cpus: int) -> tuple[Path, float] | None:
    """The cgroup with the fewest cores allowed by ``cpu.max`` (``max``: no quota), when that is
    fewer than the CPUs this process may run on."""
    best: tuple[Path, float] | None = None
    for directory in directories:
        try:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            cores = int(quota) / int(period) if quota != "max" else None
        except (OSError, ValueError):
            continue
        if cores is not None and cores < cpus and (best is None or cores < best[1]) \
                and _usage_seconds(directory) is not None:
            best = (directory, cores)
    return best


def _usage_seconds(directory: Path) -> float | None:
    """CPU seconds the cgroup has used (``cpu.stat`` ``usage_usec``)."""
    usec = cgroup_stat_value(directory / "cpu.stat", "usage_usec")
    return None if usec is None else usec / 1e6
