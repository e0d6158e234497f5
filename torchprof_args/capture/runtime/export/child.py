"""The forked exporter: serialise a stopped profiler's trace outside the training process.

``export_chrome_trace`` holds the GIL for the whole serialisation (minutes for a large trace),
so a thread cannot hide it.  The training process forks instead; the child (only the forking
thread exists there) first puts every signal back to its default action (the trainer's SIGTERM
handler and wakeup fd must not run in it), exports to staging, checks that Kineto really wrote a
complete file (on ENOSPC it only logs "Failed to write to log file!" and leaves ``<name>.tmp``),
saves its job with the export's CPU time and exits: it only exports, so no inherited state (locks,
sockets, CUDA) is used for long; the rank's publisher
(:mod:`~torchprof_args.capture.runtime.export.publication`) publishes the staged trace.  SIGTERM is
blocked in the parent across the ``fork``, so no handler of the trainer runs in the child.  The
child never returns into the caller's code; errors go to the status pipe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from torchprof_args.atomic import partial_path
from torchprof_args.capture.runtime.export.job import EXIT_EXPORT_FAILED, PublishJob
from torchprof_args.capture.runtime.export.priority import lower_to_background
from torchprof_args.capture.runtime.export.status import PublishStatus, read_status, report_status

__all__ = ["Companion", "ExportIncomplete", "Exporter", "check_export", "fork_export",
           "remove_export_leftovers"]

#: what the exporter runs after the trace: ``(path, trace bytes, CPU seconds it may take) -> None``.
Companion = Callable[[str, int, float | None], None]

#: the trainer's handlers the child puts back to default (SIGPROF, SIGALRM: the child's analysis limits).
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT,
            signal.SIGPROF, signal.SIGALRM)


class ExportIncomplete(OSError):
    """The exporter returned but left no complete trace (Kineto does not raise on a full disk)."""


def check_export(path: str | os.PathLike[str]) -> None:
    """Raise :class:`ExportIncomplete` unless ``path`` holds a trace that ends like complete JSON."""
    path = Path(path)
    free_mb = _free_mb(path.parent)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            handle.seek(max(0, size - 64))
            tail = handle.read().rstrip()
    except FileNotFoundError:
        raise ExportIncomplete(f"the exporter wrote no trace file (Kineto leaves only {path.name}.tmp when a "
                               f"write fails: is the staging filesystem {path.parent} full? {free_mb:.1f} MB "
                               "free)") from None
    if size == 0 or not tail.endswith(b"}"):
        raise ExportIncomplete(f"the exported trace {path} is truncated ({size} bytes; {free_mb:.1f} MB free "
                               f"on {path.parent})")


def _free_mb(directory: Path) -> float:
    from torchprof_args.capture.runtime.host_resources import free_disk_bytes

    return free_disk_bytes(directory) / (1 << 20)


def remove_export_leftovers(target: str | os.PathLike[str]) -> None:
    """Remove what a failed export to ``target`` may leave: the file and Kineto's ``.tmp``."""
    for path in (Path(target), Path(f"{target}.tmp")):
        with contextlib.suppress(OSError):
            path.unlink()


@dataclasses.dataclass
class Exporter:
    """The training process's handle on a forked exporter: its pid, its status pipe (a failure's
    :class:`PublishStatus`) and a pidfd (it names this very process even once reaped; None where the
    platform has none)."""

    pid: int
    status_fd: int
    pidfd: int | None = None

    def __post_init__(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(self.pid)

    def reap(self, *, block: bool = False) -> tuple[int | None, float] | None:
        """``(exit code, CPU seconds)`` once it ended, None while it runs; the code is None when it was
        reaped elsewhere (an application that ignores SIGCHLD)."""
        try:
            done, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return None, 0.0
        if not done:
            return None
        return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime

    def status(self) -> PublishStatus | None:
        """The failure it reported, once it ended; None when it sent none."""
        return read_status(self.status_fd)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        for fd in (self.pidfd, self.status_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def fork_export(export: Callable[[str], None], job: PublishJob, job_path: str,
                companion: Companion | None = None, *, background: bool = True) -> Exporter:
    """Fork; the child exports ``job`` via ``export(path)``, saves the job again at ``job_path`` with
    the export's CPU time (the publisher's budget is a share of it) and exits 0; on failure it reports
    on its status pipe and exits with ``EXIT_EXPORT_FAILED``.

    ``companion(path, trace_bytes, seconds)``, when given, then writes ``job.memory_path`` from the
    profiler's results the child still holds (PyTorch's memory categorisation; it never raises)
    within its part of the trace's analysis budget.
    ``background``: the child lowers itself to the lowest CPU and I/O priority first
    (:func:`~torchprof_args.capture.runtime.export.priority.lower_to_background`).
    Returns the child; raises ``OSError`` (EAGAIN, ENOMEM) when the fork fails.
    """
    staged_tmp = str(partial_path(job.staged_path))
    status_fd, write_fd = os.pipe()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the child unblocks after its reset
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(status_fd)
        os.close(write_fd)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write_fd)
        return Exporter(pid, status_fd)
    try:
        _reset_signals(mask)
        if background:
            lower_to_background()
        started = time.process_time()  # CPU: the child's only thread
        export(staged_tmp)
        check_export(staged_tmp)
        os.replace(staged_tmp, job.staged_path)
        exported = dataclasses.replace(job, export_seconds=time.process_time() - started)
        if companion is not None and job.memory_path:
            started = time.process_time()
            companion(job.memory_path, os.path.getsize(job.staged_path), exported.categorisation_seconds())
            exported.categorisation_spent = time.process_time() - started
        exported.save(job_path)
        os._exit(0)  # exported: the rank's publisher publishes it
    except BaseException as err:  # noqa: BLE001 - report anything, then leave
        with contextlib.suppress(BaseException):
            error = f"export failed in the forked child: {type(err).__name__}: {err}"
            report_status(write_fd, PublishStatus(trace_path=job.trace_path, rank=job.rank, error=error))
            remove_export_leftovers(staged_tmp)
    finally:
        os._exit(EXIT_EXPORT_FAILED)
    return 0  # not reached


def _reset_signals(parent_mask: Iterable[int]) -> None:
    """First thing in the child: default actions, no wakeup fd, then the parent's signal mask."""
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for signum in _HANDLED:
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signum) not in (signal.SIG_IGN,):
                signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, parent_mask)
