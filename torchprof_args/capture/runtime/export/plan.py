"""Per flush: where the raw trace is staged and whether a forked child may export it.

Decided from what is free *now* (:mod:`torchprof_args.capture.runtime.host_resources`), for this rank's share
of the node: every rank of the node flushes at the same iteration into the same RAM, ``/dev/shm``
and local disk, so free space and memory are divided by the node's rank count.

* Staging in RAM (tmpfs such as ``/dev/shm``) costs the trace's size in memory charged to the
  job; it is used only while memory above ``--torch-profile-min-free-host-mb`` covers it.
* A forked exporter shares the trainer's pages copy-on-write; at worst the trainer rewrites all
  of its anonymous memory while the child runs (e.g. CPU optimizer state under ZeRO-Offload), so
  ``fork`` is chosen only when memory covers that too.  Otherwise the trace is exported inline
  (on the training thread, fenced) to a staging directory on disk.

The trace's size is estimated from the previous trace of this run (per recorded step), else
:data:`FIRST_TRACE_BYTES_PER_STEP`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torchprof_args.capture.runtime.export.staging import StagingArea
from torchprof_args.capture.runtime.host_resources import (
    HostMemoryProbe,
    anonymous_rss_bytes,
    free_disk_bytes,
    local_world_size,
)

__all__ = ["FIRST_TRACE_BYTES_PER_STEP", "ExportPlan", "ExportPlanner"]

#: Assumed raw trace size per recorded step before this run has exported one.
FIRST_TRACE_BYTES_PER_STEP = 64 << 20
#: The smallest estimate (a tiny previous trace says little about the next window).
MIN_ESTIMATE_BYTES = 4 << 20
_MARGIN = 1.5
_MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """How one trace leaves the process; ``note`` says why, when it differs from the flags' choice."""

    mode: str
    staging: Path
    note: str | None = None


class ExportPlanner:
    """Chooses an :class:`ExportPlan` per flush; ``learn`` feeds it the size of each exported trace."""

    def __init__(self, mode: str, staging: StagingArea, min_free_bytes: int, *,
                 probe: HostMemoryProbe | None = None) -> None:
        self.mode = mode
        self.staging = staging
        self.min_free_bytes = min_free_bytes
        self.probe = probe or HostMemoryProbe()
        self.local_ranks = local_world_size()
        self._bytes_per_step: float | None = None

    def learn(self, raw_bytes: float, steps: int) -> None:
        if raw_bytes > 0:
            self._bytes_per_step = raw_bytes / max(1, steps)

    def estimate(self, steps: int) -> int:
        per_step = self._bytes_per_step if self._bytes_per_step is not None else FIRST_TRACE_BYTES_PER_STEP
        return max(MIN_ESTIMATE_BYTES, int(per_step * max(1, steps) * _MARGIN))

    def plan(self, steps: int) -> ExportPlan:
        estimate = self.estimate(steps)
        memory = self.probe.free()
        share = (memory.free_bytes - self.min_free_bytes) // self.local_ranks
        notes: list[str] = []
        directory = self._staging_for(estimate, ram_allowed=share >= estimate, notes=notes)
        mode = self.mode
        if mode == "fork":
            worst_copy = anonymous_rss_bytes()
            left = share - (estimate if self.staging.ram[directory] else 0)
            if left < worst_copy:
                mode = "inline"
                notes = [
                    f"memory for this rank ({max(0, share) / _MB:.0f} MB: {memory.free_mb:.0f} MB free by "
                    f"{memory.source}, less --torch-profile-min-free-host-mb, shared by {self.local_ranks} "
                    f"local rank(s)) does not cover a forked exporter ({worst_copy / _MB:.0f} MB of "
                    "anonymous memory that copy-on-write may duplicate); exporting inline"]
                directory = self._staging_for(estimate, ram_allowed=False, notes=notes)
        return ExportPlan(mode, directory, "; ".join(notes) or None)

    def fallback(self, steps: int) -> ExportPlan:
        """Inline to disk: after a failed ``fork``."""
        notes: list[str] = []
        return ExportPlan("inline", self._staging_for(self.estimate(steps), ram_allowed=False, notes=notes),
                          "; ".join(notes) or None)

    def _staging_for(self, estimate: int, *, ram_allowed: bool, notes: list[str]) -> Path:
        dirs = self.staging.dirs
        allowed = [d for d in dirs if ram_allowed or not self.staging.ram[d]] or dirs
        room = {d: free_disk_bytes(d) // self.local_ranks for d in allowed}
        fitting = [d for d in allowed if room[d] >= estimate]
        chosen = fitting[0] if fitting else max(allowed, key=lambda d: room[d])
        if not fitting:
            notes.append(f"no staging directory has room for the estimated {estimate / _MB:.0f} MB per rank "
                         f"(most: {room[chosen] / _MB:.0f} MB in {chosen}); trying there")
        elif chosen != dirs[0]:
            why = ("memory is too short to stage in RAM" if dirs[0] not in allowed else
                   f"it has less free than the estimated {estimate / _MB:.0f} MB per rank")
            notes.append(f"staging in {chosen}, not {dirs[0]}: {why}")
        return chosen
