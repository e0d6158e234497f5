"""Fault injection helpers shared by the fault job, the fault tests and ``benchmarks/bench_faults.py``.

Real faults only: small tmpfs mounts (full and read-only filesystems), a pids cgroup or
``RLIMIT_NPROC`` (fork fails with EAGAIN), signals to real processes.  What needs root (``mount``,
cgroups) says so through :func:`can_mount`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

PUBLISHER_MODULE = "torchprof_args.capture.runtime.export.publisher"


# -- filesystems -----------------------------------------------------------------------------

def can_mount() -> bool:
    """Whether this process can mount a tmpfs (root, and mount(8) present)."""
    return os.geteuid() == 0 and subprocess.run(["which", "mount"], capture_output=True).returncode == 0


@contextlib.contextmanager
def tmpfs(path: str | os.PathLike[str], size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"8m"``) mounted at ``path`` for the block; always unmounted."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=755" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: str | os.PathLike[str], *, read_only: bool) -> None:
    subprocess.run(["mount", "-o", f"remount,{'ro' if read_only else 'rw'}", str(path)], check=True)


def fill_filesystem(directory: str | os.PathLike[str], leave_bytes: int = 16 << 10) -> Path:
    """Write ``directory/filler`` until the filesystem has about ``leave_bytes`` free."""
    filler = Path(directory) / "filler"
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    chunk = b"\0" * (1 << 20)
    with open(filler, "ab") as handle:
        remaining = max(0, free - leave_bytes)
        while remaining > 0:
            try:
                handle.write(chunk[: min(len(chunk), remaining)])
                handle.flush()
            except OSError:
                break
            remaining -= min(len(chunk), remaining)
    return filler


# -- processes -------------------------------------------------------------------------------

def children(pid: int | None = None) -> list[int]:
    """The child processes of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def publishers_of(pid: int | None = None) -> list[int]:
    """The processes publishing ``pid``'s traces: its children running the publisher (one per traced
    rank; a new one after one died)."""
    return [child for child in children(pid) if PUBLISHER_MODULE in cmdline(child)]


def processes_mentioning(text: str) -> list[int]:
    """Every process whose command line contains ``text`` (orphaned publishers, in tests)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and text in cmdline(int(entry.name)):
            found.append(int(entry.name))
    return found


def delay_exports(seconds: float) -> None:
    """Make every ``export_chrome_trace`` of this process take ``seconds`` longer (a slow flush: with
    ``--torch-profile-export inline`` the training thread pays it)."""
    import torch

    export = torch.profiler.profile.export_chrome_trace

    def slow_export(self: torch.profiler.profile, path: str, *args: object, **kwargs: object) -> object:
        time.sleep(seconds)
        return export(self, path, *args, **kwargs)

    torch.profiler.profile.export_chrome_trace = slow_export


def stop_for(pid: int, seconds: float) -> None:
    """Freeze ``pid`` for ``seconds`` (a slow publisher)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)


class ForkLimit:
    """Make ``fork`` fail with EAGAIN for this process: a pids cgroup at its current count (root),
    else ``RLIMIT_NPROC`` (which root ignores)."""

    def __init__(self) -> None:
        self._cgroup: Path | None = None
        self._parent_procs: Path | None = None
        self._rlimit: tuple[int, int] | None = None

    def __enter__(self) -> ForkLimit:
        if os.geteuid() != 0:
            self._rlimit = resource.getrlimit(resource.RLIMIT_NPROC)
            resource.setrlimit(resource.RLIMIT_NPROC, (0, self._rlimit[1]))
            return self
        root, member = _pids_cgroup()
        self._parent_procs = root / member.lstrip("/") / "cgroup.procs"
        self._cgroup = root / member.lstrip("/") / f"torchprof-fault-{os.getpid()}"
        self._cgroup.mkdir()
        (self._cgroup / "cgroup.procs").write_text(str(os.getpid()))
        (self._cgroup / "pids.max").write_text((self._cgroup / "pids.current").read_text().strip())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rlimit is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, self._rlimit)
            return
        (self._cgroup / "pids.max").write_text("max")
        self._parent_procs.write_text(str(os.getpid()))
        for _ in range(50):
            try:
                self._cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def _pids_cgroup() -> tuple[Path, str]:
    """(mount point, this process's path) of the pids controller, v1 or v2."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids"), path
    unified = Path("/sys/fs/cgroup")
    if "pids" in (unified / "cgroup.controllers").read_text().split():
        path = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if line.startswith("0::"))
        return unified, path
    raise OSError("no pids cgroup controller")


def can_limit_forks() -> bool:
    """Whether :class:`ForkLimit` can work here (as root: a child pids cgroup with ``pids.max``)."""
    if os.geteuid() != 0:
        return True
    try:
        root, member = _pids_cgroup()
        probe = root / member.lstrip("/") / f"torchprof-probe-{os.getpid()}"
        probe.mkdir()
        try:
            return (probe / "pids.max").exists()
        finally:
            probe.rmdir()
    except (OSError, StopIteration):
        return False
