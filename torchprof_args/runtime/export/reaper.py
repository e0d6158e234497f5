"""Waiting on exporter/publisher processes off the training thread, and cleaning up after each.

A reaper thread waits on each process in turn (``pidfd`` + ``select``: no GIL held while it
waits), stops one that outlives ``--torch-profile-flush-timeout``, reads its outcome from the
status pipe (or, when none came back, names the reason from how it ended: killed by a signal, the
export failed, ...), and removes whatever a killed process left: staged files, Kineto's ``.tmp``,
hidden partial files in the output directory, the job file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torchprof_args.log import get_logger
from torchprof_args.runtime.export.job import EXIT_EXPORT_FAILED, EXIT_REJECTED, PublishJob
from torchprof_args.runtime.export.status import PublishStatus, read_status
from torchprof_args.runtime.host_resources import free_disk_bytes

__all__ = ["Pending", "Reaper", "remove_job_files"]

logger = get_logger(__name__)

_STOP_SECONDS = 2.0  # between SIGTERM and SIGKILL for a process being stopped


@dataclasses.dataclass
class Pending:
    """One exporter/publisher process the training process is responsible for."""

    pid: int
    job: PublishJob
    job_path: str
    steps: int
    status_fd: int
    started: float = dataclasses.field(default_factory=time.monotonic)
    popen: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    #: Refers to this very process even after it is reaped (no signal to a reused pid).
    pidfd: int | None = None

    def send(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            else:
                os.kill(self.pid, signum)


def remove_job_files(job: PublishJob, job_path: str | os.PathLike[str]) -> None:
    """Remove the job file and everything the job's processes may have left behind."""
    for path in (Path(job_path), *job.leftovers()):
        with contextlib.suppress(OSError):
            path.unlink()


class Reaper:
    """Watches pending processes; ``on_done(pending, status)`` runs on the reaper thread for each."""

    def __init__(self, rank: int, timeout: float, on_done: Callable[[Pending, PublishStatus], None]) -> None:
        self.rank = rank
        self.timeout = timeout
        self._on_done = on_done
        self._queue: queue.Queue[Pending | None] = queue.Queue()
        self._in_flight: dict[int, Pending] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def pending(self) -> list[Pending]:
        with self._lock:
            return list(self._in_flight.values())

    def watch(self, pending: Pending) -> None:
        with contextlib.suppress(AttributeError, OSError):
            pending.pidfd = os.pidfd_open(pending.pid)
        with self._lock:
            self._in_flight[pending.pid] = pending
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="torchprof-reaper", daemon=True)
            self._thread.start()
        self._queue.put(pending)

    def wait_all(self, deadline: float | Callable[[], float]) -> bool:
        """Wait until every process has been reaped or ``deadline`` (monotonic; a callable is asked
        again while waiting, so it can come sooner); True if all were."""
        current = deadline if callable(deadline) else (lambda: deadline)
        while self.in_flight and time.monotonic() < current():
            time.sleep(0.02)
        return not self.in_flight

    def stop_all(self) -> None:
        """SIGTERM every pending process, SIGKILL the ones still there after a moment, wait for the
        reaper to clean up after them (bounded)."""
        pendings = self.pending()
        for pending in pendings:
            pending.send(signal.SIGTERM)
        if not self.wait_all(time.monotonic() + _STOP_SECONDS):
            for pending in self.pending():
                pending.send(signal.SIGKILL)
            self.wait_all(time.monotonic() + _STOP_SECONDS)
        for pending in pendings:  # also when the reaper thread cannot run (called from a watchdog)
            remove_job_files(pending.job, pending.job_path)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=_STOP_SECONDS)
            self._thread = None

    # -- the thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            pending = self._queue.get()
            if pending is None:
                return
            if not _wait(pending, pending.started + self.timeout):
                logger.error("rank %d: publishing %s took longer than --torch-profile-flush-timeout "
                             "(%.0f s); stopping it", self.rank, pending.job.trace_path, self.timeout)
                _terminate(pending)
            try:
                self._finish(pending)
            except Exception as err:  # noqa: BLE001 - the thread must survive to reap the others
                logger.error("rank %d: cleaning up after %s failed: %s", self.rank, pending.job.trace_path,
                             err)

    def _finish(self, pending: Pending) -> None:
        status = read_status(pending.status_fd) or PublishStatus(
            trace_path=pending.job.trace_path, rank=pending.job.rank, error=_reason(pending))
        for fd in (pending.status_fd, pending.pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        remove_job_files(pending.job, pending.job_path)
        with self._lock:
            self._in_flight.pop(pending.pid, None)
        self._on_done(pending, status)


def _reason(pending: Pending) -> str:
    """Why a process that sent no status ended, with the staging space when it is low."""
    code = pending.returncode
    if code is None:
        reason = "the exporter/publisher did not finish"
    elif code < 0:
        reason = f"the exporter/publisher (pid {pending.pid}) was killed by {signal.Signals(-code).name}"
    elif code == EXIT_EXPORT_FAILED:
        reason = "the export in the forked child failed and could not report why"
    elif code == EXIT_REJECTED:
        reason = "the publisher rejected its job"
    else:
        reason = f"the exporter/publisher exited with code {code} without a status"
    staging = Path(pending.job.staged_path).parent
    free_mb = free_disk_bytes(staging) / (1 << 20)
    if free_mb < 64:
        reason += f" (staging {staging} has {free_mb:.1f} MB free: is it full?)"
    return reason


def _wait(pending: Pending, deadline: float) -> bool:
    """Wait (without holding the GIL) until the process exits or ``deadline``; True if it exited."""
    if pending.popen is not None:
        try:
            pending.returncode = pending.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    while True:
        try:
            done, status = os.waitpid(pending.pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (e.g. SIGCHLD ignored by the application)
            return True
        if done:
            pending.returncode = os.waitstatus_to_exitcode(status)
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if pending.pidfd is not None:
            select.select([pending.pidfd], [], [], min(remaining, 60.0))
        else:
            time.sleep(min(remaining, 0.1))


def _terminate(pending: Pending) -> None:
    pending.send(signal.SIGTERM)
    if not _wait(pending, time.monotonic() + _STOP_SECONDS * 5):
        pending.send(signal.SIGKILL)
        _wait(pending, time.monotonic() + _STOP_SECONDS * 5)
