"""Node-local staging: private directories where raw traces wait for their publisher.

Each base (``--torch-profile-staging-dir``, else ``/dev/shm`` and the temp directory) gets
``<base>/torchprof-<uid>/pid<pid>``: both levels created 0700 and refused when owned by someone
else, group- or world-writable or a symlink (:mod:`torchprof_args.private_dir`), because the
publisher runs what it reads there.  Every ``pid`` directory holds a ``.lock`` file on which the
training process takes a shared ``flock`` whose open file is inherited by its exporters and
publishers: the lock is held exactly while any of them lives.  At start, directories of this
user whose lock nobody holds and whose pid is gone (a crashed or OOM-killed job) are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from torchprof_args.capture.runtime.host_resources import is_ram_backed
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.log import get_logger
from torchprof_args.private_dir import ensure_private_dir

__all__ = ["LOCK_NAME", "STAGING_FLAG", "StagingArea", "pid_alive", "sweep_stale"]

logger = get_logger(__name__)

STAGING_FLAG = "--torch-profile-staging-dir"
LOCK_NAME = ".lock"


class StagingArea:
    """This process's private staging directories, one per usable base, created by :meth:`open`.

    ``dirs`` lists them in order of preference; ``disk_dirs`` those not in RAM (what an inline
    export under memory pressure uses).
    """

    def __init__(self, requested: str | None, *, rank: int = 0) -> None:
        self.requested = requested
        self.rank = rank
        self.dirs: list[Path] = []
        self.ram: dict[Path, bool] = {}
        self._locks: list[int] = []

    def open(self) -> None:
        """Create, check and lock the directories (and sweep stale ones); raises
        :class:`~torchprof_args.errors.TorchProfileArgsError` naming ``--torch-profile-staging-dir``."""
        problems = []
        for base in self._bases():
            try:
                self._add(base)
            except TorchProfileArgsError as err:
                if self.requested and base == Path(self.requested):
                    raise
                problems.append(str(err))
        if not self.dirs:
            raise TorchProfileArgsError(f"no usable staging directory: {' '.join(problems)} Give a private, "
                                        f"writable node-local directory with {STAGING_FLAG}.")
        for problem in problems:
            logger.warning("rank %d: staging skips %s", self.rank, problem)

    def _bases(self) -> list[Path]:
        temp = Path(os.environ.get("TMPDIR") or "/tmp")
        if self.requested:
            return list(dict.fromkeys([Path(self.requested), temp]))  # the temp dir: fallback when full
        shm = Path("/dev/shm")
        usable_shm = shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)
        return [shm, temp] if usable_shm else [temp]

    def _add(self, base: Path) -> None:
        user_dir = base / f"torchprof-{os.getuid()}"
        ensure_private_dir(str(user_dir), STAGING_FLAG)
        sweep_stale(user_dir, rank=self.rank)
        directory = user_dir / f"pid{os.getpid()}"
        ensure_private_dir(str(directory), STAGING_FLAG)
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._locks.append(fd)
        self.dirs.append(directory)
        self.ram[directory] = is_ram_backed(directory)

    @property
    def disk_dirs(self) -> list[Path]:
        return [d for d in self.dirs if not self.ram[d]]

    @property
    def lock_fds(self) -> tuple[int, ...]:
        """The lock files' descriptors: children keep them open so the directories stay theirs."""
        return tuple(self._locks)

    def contains(self, path: str | os.PathLike[str]) -> bool:
        resolved = Path(os.path.realpath(path))
        return any(resolved.parent == d.resolve() for d in self.dirs)

    def close(self) -> None:
        """Remove the directories (everything left in them is this process's) and drop the locks."""
        for directory in self.dirs:
            names = [p.name for p in directory.iterdir()] if directory.is_dir() else []
            leftovers = [name for name in names if name != LOCK_NAME]
            if leftovers:
                logger.warning("rank %d: removing staging leftovers %s from %s", self.rank, leftovers,
                               directory)
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(OSError):
                directory.parent.rmdir()  # torchprof-<uid>, when no other job of this user stages here
        for fd in self._locks:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._locks.clear()
        self.dirs.clear()


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlocked(directory: Path) -> bool:
    """Nobody (trainer, exporter or publisher) holds the directory's lock."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sweep_stale(user_dir: Path, *, rank: int = 0) -> list[Path]:
    """Remove ``pid<N>`` directories of dead processes that nobody holds locked; returns them."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in user_dir.iterdir():
            pid = entry.name[3:]
            if not entry.name.startswith("pid") or not pid.isdigit() or int(pid) == os.getpid():
                continue
            if entry.is_symlink() or not entry.is_dir() or pid_alive(int(pid)) or not _unlocked(entry):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    if removed:
        logger.info("rank %d: removed %d stale staging director%s of ended jobs in %s", rank, len(removed),
                    "y" if len(removed) == 1 else "ies", user_dir)
    return removed
