"""The forked exporter: serialise a stopped profiler's trace outside the training process.

``export_chrome_trace`` holds the GIL for the whole serialisation (minutes for a large trace),
so a thread cannot hide it.  The training process forks instead; the child (only the forking
thread exists there) first puts every signal back to its default action (the trainer's SIGTERM
handler and wakeup fd must not run in it), exports to staging, checks that Kineto really wrote a
complete file (on ENOSPC it only logs "Failed to write to log file!" and leaves ``<name>.tmp``),
then ``exec``\\ s the publisher so that no inherited state (locks, sockets, CUDA) lingers, or, when
the writer has a publisher fork server (:mod:`~torchprof_args.runtime.export.forkserver`), exits: the
server's worker publishes.  SIGTERM
is blocked in the parent across the ``fork``, so no handler of the trainer runs in the child.
The child never returns into the caller's code; errors go to the status pipe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from torchprof_args.atomic import partial_path
from torchprof_args.runtime.export.job import EXIT_EXPORT_FAILED, PublishJob
from torchprof_args.runtime.export.priority import lower_to_background
from torchprof_args.runtime.export.status import PublishStatus, report_status

__all__ = ["Companion", "ExportIncomplete", "check_export", "fork_export", "remove_export_leftovers"]

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
    from torchprof_args.runtime.host_resources import free_disk_bytes

    return free_disk_bytes(directory) / (1 << 20)


def remove_export_leftovers(target: str | os.PathLike[str]) -> None:
    """Remove what a failed export to ``target`` may leave: the file and Kineto's ``.tmp``."""
    for path in (Path(target), Path(f"{target}.tmp")):
        with contextlib.suppress(OSError):
            path.unlink()


def fork_export(export: Callable[[str], None], job: PublishJob, job_path: str, argv: list[str] | None,
                env: dict[str, str], keep_fds: Sequence[int],
                companion: Companion | None = None, *,
                background: bool = True) -> int:
    """Fork; the child exports ``job`` via ``export(path)`` and ``exec``\\ s ``argv`` (the publisher,
    told the CPU time the export took with ``--export-cpu``), or with ``argv`` None exits 0.

    ``keep_fds`` (the status pipe, the staging locks) stay open in the child and across ``exec``.
    ``companion(path, trace_bytes, seconds)``, when given, then writes ``job.memory_path`` from the
    profiler's results the child still holds (PyTorch's memory categorisation; it never raises)
    within its part of the trace's analysis budget.  The child then saves the job again at
    ``job_path`` with the export's CPU time (the publisher's budget is a share of it) and the
    companion's.
    ``background``: the child lowers itself to the lowest CPU and I/O priority first
    (:func:`~torchprof_args.runtime.export.priority.lower_to_background`, inherited by the publisher).
    Returns the child's pid; raises ``OSError`` (EAGAIN, ENOMEM) when the fork fails.
    """
    staged_tmp = str(partial_path(job.staged_path))
    status_fd = keep_fds[0] if keep_fds else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the child unblocks after its reset
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return pid
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
        if argv is None:
            os._exit(0)  # exported: the fork server's worker publishes
        argv = [*argv, "--export-cpu", f"{time.process_time():.6f}"]
        for fd in keep_fds:
            os.set_inheritable(fd, True)
        _close_fds_except(keep_fds)
        os.execve(argv[0], argv, env)
    except BaseException as err:  # noqa: BLE001 - report anything, then leave
        with contextlib.suppress(BaseException):
            error = f"export failed in the forked child: {type(err).__name__}: {err}"
            report_status(status_fd, PublishStatus(trace_path=job.trace_path, rank=job.rank, error=error))
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


def _close_fds_except(keep: Sequence[int]) -> None:
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, _max_fd())


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 65536
