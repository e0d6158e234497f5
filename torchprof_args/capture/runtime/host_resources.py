"""Host memory and staging space actually free for this job, measured when a decision needs it.

A rank is killed by the OOM killer of its cgroup (or of the host) before torch sees any error, so
the profiler never trusts a figure taken at start-up.  :class:`HostMemoryProbe` resolves once
which files say how much memory this job may still use, then re-reads them on demand (a few
small files, tens of microseconds; the profiler reads them only at flushes and recorded steps):

* cgroup v2: ``memory.max`` minus the working set (``memory.current`` less reclaimable
  ``inactive_file``), at the job's cgroup and every limited ancestor;
* cgroup v1: the same from ``memory.limit_in_bytes``, ``memory.usage_in_bytes`` and
  ``total_inactive_file``;
* ``MemAvailable`` of ``/proc/meminfo`` (the kernel's estimate for the whole host).

The smallest figure wins.  Files staged in ``/dev/shm`` (tmpfs) are RAM charged to the cgroup
that wrote them, so they lower these figures too.  Import-light: no torch.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from torchprof_args.capture.runtime.schedule import Action
from torchprof_args.log import get_logger

if TYPE_CHECKING:  # the guard's collaborators (annotations only: this module stays import-light)
    from torchprof_args.capture.runtime.fence import Fence
    from torchprof_args.capture.runtime.timeline import Timeline

__all__ = [
    "HostMemory",
    "HostMemoryProbe",
    "WindowMemoryGuard",
    "anonymous_rss_bytes",
    "cgroup_stat_value",
    "cgroup_v2_directories",
    "free_disk_bytes",
    "is_ram_backed",
    "local_world_size",
]

logger = get_logger(__name__)

#: cgroup v1 reports "no limit" as a page-rounded 2**63 - 1.
_V1_UNLIMITED = 1 << 62
_MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """Bytes this job may still allocate, and which limit says so (for log lines)."""

    free_bytes: int
    source: str

    @property
    def free_mb(self) -> float:
        return self.free_bytes / _MiB


@dataclasses.dataclass(frozen=True)
class _CgroupLimit:
    directory: Path
    version: int

    def headroom(self) -> int | None:
        """``limit - working set`` in bytes, or None when this level has no limit."""
        names = (("memory.max", "memory.current", "inactive_file") if self.version == 2 else
                 ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
        try:
            limit_text = (self.directory / names[0]).read_text().strip()
            if limit_text == "max" or int(limit_text) >= _V1_UNLIMITED:
                return None
            usage = int((self.directory / names[1]).read_text())
            inactive = cgroup_stat_value(self.directory / "memory.stat", names[2]) or 0
        except (OSError, ValueError):
            return None
        return int(limit_text) - max(0, usage - inactive)


class HostMemoryProbe:
    """Free host memory for this job: the tightest cgroup limit, else ``MemAvailable``.

    ``proc`` and ``cgroup_root`` exist so that tests can point the probe at a prepared tree.
    """

    def __init__(self, proc: str | os.PathLike[str] = "/proc") -> None:
        self._meminfo = Path(proc) / "meminfo"
        self._limits = _cgroup_limits(Path(proc) / "self")

    def free(self) -> HostMemory:
        best = HostMemory(_meminfo_available(self._meminfo), "MemAvailable")
        for limit in self._limits:
            headroom = limit.headroom()
            if headroom is not None and headroom < best.free_bytes:
                best = HostMemory(max(0, headroom), f"cgroup v{limit.version} limit of {limit.directory}")
        return best


def cgroup_stat_value(path: Path, key: str) -> int | None:
    """One ``key value`` line of a cgroup statistics file (``memory.stat``, ``cpu.stat``); None when
    absent or unreadable."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _meminfo_available(path: Path) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62  # unknown: no limit from here


def _cgroup_limits(self_dir: Path) -> list[_CgroupLimit]:
    """The memory cgroup directories (leaf first, then ancestors) that may hold a limit."""
    try:
        memberships = (self_dir / "cgroup").read_text().splitlines()
        mounts = (self_dir / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    limits: list[_CgroupLimit] = []
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        version = 2 if hierarchy == "0" and controllers == "" else 1
        if version == 1 and "memory" not in controllers.split(","):
            continue
        mount = _cgroup_mount(mounts, version)
        if mount is None:
            continue
        mount_root, mountpoint = mount
        relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
        directory = (mountpoint / relative).resolve() if relative not in ("", ".") else mountpoint
        if not directory.is_dir():
            directory = mountpoint  # a cgroup namespace shows the job's own cgroup as the root
        while True:
            limits.append(_CgroupLimit(directory, version))
            if directory == mountpoint or mountpoint not in directory.parents:
                break
            directory = directory.parent
    return limits


def cgroup_v2_directories(proc: str | os.PathLike[str] = "/proc") -> list[Path]:
    """This process's cgroup v2 directory and its ancestors up to the mount (leaf first); [] on v1."""
    return [limit.directory for limit in _cgroup_limits(Path(proc) / "self") if limit.version == 2]


def _cgroup_mount(mounts: list[str], version: int) -> tuple[str, Path] | None:
    """(root inside the hierarchy, mount point) of the cgroup v2 or v1-memory mount."""
    for line in mounts:
        fields = line.split()
        try:
            separator = fields.index("-")
        except ValueError:
            continue
        fstype, options = fields[separator + 1], fields[-1].split(",")
        v1_memory = version == 1 and fstype == "cgroup" and "memory" in options
        if (version == 2 and fstype == "cgroup2") or v1_memory:
            return fields[3], Path(fields[4])
    return None


def free_disk_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer can still put on ``path``'s filesystem (0 when unknown)."""
    try:
        usage = os.statvfs(path)
        return usage.f_bavail * usage.f_frsize
    except OSError:
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return 0


def is_ram_backed(path: str | os.PathLike[str],
                  mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo") -> bool:
    """Whether ``path`` lies on tmpfs/ramfs (RAM charged to the writer's cgroup), by the longest
    mount point that contains it (the last of stacked mounts wins)."""
    target = os.path.realpath(path)
    best, ram = "", False
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return str(target).startswith("/dev/shm")
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        mountpoint = fields[4].replace("\\040", " ")
        inside = target == mountpoint or target.startswith(mountpoint.rstrip("/") + "/")
        if inside and len(mountpoint) >= len(best):
            best, ram = mountpoint, fields[fields.index("-") + 1] in ("tmpfs", "ramfs")
    return ram


def anonymous_rss_bytes(status: str | os.PathLike[str] = "/proc/self/status") -> int:
    """This process's resident anonymous memory: what a forked child could copy at worst."""
    try:
        for line in Path(status).read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def local_world_size() -> int:
    """Ranks sharing this node (and its RAM, /dev/shm and local disk), from the launcher; else 1."""
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        digits = os.environ.get(name, "").split("(")[0]
        if digits.isdigit() and int(digits) > 0:
            return int(digits)
    return 1


class WindowMemoryGuard:
    """Ends a recording window early, on every rank at the same iteration, when host memory runs low.

    At each recorded step that another recorded step follows, every rank reads
    :class:`HostMemoryProbe` and posts a vote on the fence group (0, or ``1 + free MB`` when below
    ``min_free_bytes``); at the next step every rank collects the same votes, and when any rank
    was low that step becomes the window's last on every rank.  One step of delay buys an
    asynchronous collective: no rank blocks on it, and idle steps never see it.
    """

    def __init__(self, min_free_bytes: int, fence: Fence, *, probe: HostMemoryProbe | None = None) -> None:
        self.min_free_bytes = min_free_bytes
        self.fence = fence
        self.probe = (probe or HostMemoryProbe()) if min_free_bytes > 0 else None
        self.last: HostMemory | None = None

    @property
    def enabled(self) -> bool:
        return self.probe is not None

    def step(self, window_continues: bool) -> list[tuple[int, float]] | None:
        """At a step of a recording window: the ``(rank, free MB)`` of low ranks when the window
        must end at this step (the same answer on every rank), else None."""
        low = None
        if self.fence.vote_pending:
            votes = self.fence.collect_vote() or []
            low = [(rank, vote - 1.0) for rank, vote in enumerate(votes) if vote > 0] or None
        if window_continues and low is None and self.probe is not None:
            self.last = self.probe.free()
            below = self.last.free_bytes < self.min_free_bytes
            self.fence.post_vote(1 + int(self.last.free_mb) if below else 0)
        return low if window_continues else None

    def check(self, iteration: int, timeline: Timeline, *, rank: int) -> None:
        """Inside windows only: cut ``timeline``'s window at ``iteration`` (on every rank: the votes
        are the same everywhere) when a rank ran low on host memory, and say why."""
        action = timeline.global_action(iteration)
        if action not in (Action.RECORD, Action.RECORD_AND_SAVE) and not self.fence.vote_pending:
            return
        low = self.step(window_continues=action is Action.RECORD)
        if not low:
            return
        planned_last = timeline.cut_window(iteration)
        ranks = ", ".join(f"rank {low_rank}: {free_mb:.0f} MB" for low_rank, free_mb in low)
        logger.warning("rank %d: host memory below --torch-profile-min-free-host-mb (%d MB) while recording "
                       "(%s free); ending the window at iteration %d instead of %d on every rank", rank,
                       self.min_free_bytes >> 20, ranks, iteration, planned_last)

    def abandon(self) -> None:
        """Collect a vote still in flight (leaving the window; every rank posted it)."""
        if self.fence.vote_pending:
            self.fence.collect_vote(timeout=5.0)
