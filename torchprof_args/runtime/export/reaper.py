"""Waiting on exporter/publisher processes off the training thread, and cleaning up after each.

A reaper thread waits on each process in turn (``pidfd`` + ``select``: no GIL held while it
waits), stops one that outlives ``--torch-profile-flush-timeout``, reads its outcome from the
status pipe (or, when none came back, names the reason from how it ended: killed by a signal, the
export failed, ...), and removes whatever a killed process left: staged files, Kineto's ``.tmp``,
hidden partial files in the output directory, the job file.

With a publisher fork server (:mod:`~torchprof_args.runtime.export.forkserver`) a trace takes two
processes in turn: the forked exporter (:attr:`Stage.EXPORTING`), which exits once the trace is
staged, then a worker of the server (:attr:`Stage.SERVED`); the writer's ``hand_off`` starts the
worker, on this thread, when the trace is :attr:`Stage.STAGED` (also after an inline export).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
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
from torchprof_args.runtime.export.forkserver import ForkServer, Worker
from torchprof_args.runtime.export.job import EXIT_EXPORT_FAILED, EXIT_REJECTED, PublishJob
from torchprof_args.runtime.export.status import PublishStatus, read_status
from torchprof_args.runtime.host_resources import free_disk_bytes

__all__ = ["Pending", "Reaper", "Stage", "remove_job_files"]

logger = get_logger(__name__)

_STOP_SECONDS = 2.0  # between SIGTERM and SIGKILL for a process being stopped


class Stage(enum.Enum):
    """Which process has a trace now."""

    #: The forked exporter, which exits once the trace is staged (a fork server publishes it).
    EXPORTING = "exporting"
    #: Staged, no process yet: the writer's ``hand_off`` starts its publisher.
    STAGED = "staged"
    #: A publisher process that is the training process's child (``exec``'d by the forked exporter,
    #: or started after an inline export).
    PUBLISHING = "publishing"
    #: A worker of the publisher fork server.
    SERVED = "served"


@dataclasses.dataclass
class Pending:
    """One trace the training process is responsible for, and the process that has it now."""

    #: None while :attr:`Stage.STAGED`.
    pid: int | None
    job: PublishJob
    job_path: str
    steps: int
    #: The current process's status pipe (None while staged).
    status_fd: int | None
    stage: Stage = Stage.PUBLISHING
    started: float = dataclasses.field(default_factory=time.monotonic)
    popen: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    #: Refers to this very process even after it is reaped (no signal to a reused pid).
    pidfd: int | None = None
    #: :attr:`Stage.SERVED`: the fork server and its worker.
    server: ForkServer | None = None
    worker: Worker | None = None
    #: CPU seconds of the forked exporter that exited (:attr:`Stage.EXPORTING`).
    export_cpu: float = 0.0
    #: Set once the trace is finished (published, failed or stopped) and its files are cleaned up.
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def send(self, signum: int) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            else:
                os.kill(self.pid, signum)

    def serve(self, server: ForkServer, worker: Worker, status_fd: int) -> None:
        """Now a worker of ``server`` has it, reporting on ``status_fd``."""
        self.stage, self.server, self.worker = Stage.SERVED, server, worker
        self.pid, self.pidfd, self.status_fd, self.returncode = worker.pid, worker.pidfd, status_fd, None

    def publish_in(self, popen: subprocess.Popen[bytes], status_fd: int) -> None:
        """Now a publisher process started by the training process has it."""
        self.stage, self.popen, self.pid, self.status_fd, self.returncode = (
            Stage.PUBLISHING, popen, popen.pid, status_fd, None)
        self.pidfd = _pidfd(popen.pid)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def remove_job_files(job: PublishJob, job_path: str | os.PathLike[str]) -> None:
    """Remove the job file and everything the job's processes may have left behind."""
    for path in (Path(job_path), *job.leftovers()):
        with contextlib.suppress(OSError):
            path.unlink()


#: ``hand_off(pending)``: start the publisher of a staged trace (``pending.serve`` or
#: ``pending.publish_in``); returns None then, or the trace's outcome when no process took it.
HandOff = Callable[[Pending], "PublishStatus | None"]


class Reaper:
    """Watches pending traces; ``on_done(pending, status)`` runs on the reaper thread for each."""

    def __init__(self, rank: int, timeout: float, on_done: Callable[[Pending, PublishStatus], None],
                 hand_off: HandOff | None = None) -> None:
        self.rank = rank
        self.timeout = timeout
        self._on_done = on_done
        self._hand_off = hand_off
        self._queue: queue.Queue[Pending | None] = queue.Queue()
        self._in_flight: dict[int, Pending] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def pending(self) -> list[Pending]:
        with self._lock:
            return list(self._in_flight.values())

    def start(self) -> bool:
        """Start the reaper thread unless it runs; False when no thread can start (a pids limit)."""
        if self._thread is None or not self._thread.is_alive():
            thread = threading.Thread(target=self._loop, name="torchprof-reaper", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # "can't start new thread"
                return False
            self._thread = thread
        return True

    def watch(self, pending: Pending) -> None:
        if pending.pid is not None and pending.pidfd is None:
            pending.pidfd = _pidfd(pending.pid)
        with self._lock:
            self._in_flight[id(pending)] = pending
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

    def wait_for(self, pending: Pending, deadline: float) -> bool:
        """Wait until ``pending`` is finished or ``deadline`` (monotonic); True if it was."""
        return pending.done.wait(max(0.0, deadline - time.monotonic()))

    def stop_all(self) -> None:
        """SIGTERM every pending process, SIGKILL the ones still there after a moment, wait for the
        reaper to clean up after them (bounded).  Staged traces are not handed off any more."""
        self._stopping = True
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
            try:
                self._follow(pending)
            except Exception as err:  # noqa: BLE001 - the thread must survive to reap the others
                logger.error("rank %d: cleaning up after %s failed: %s", self.rank, pending.job.trace_path,
                             err)

    def _follow(self, pending: Pending) -> None:
        """Wait for the trace's processes in turn, then finish it."""
        deadline = pending.started + self.timeout
        if pending.stage is Stage.EXPORTING:
            if not self._waited(pending, deadline):
                return self._finish(pending)
            status = read_status(pending.status_fd) if pending.status_fd is not None else None
            # exit code None: reaped by someone else (SIGCHLD ignored); the staged file says it exported
            exported = (status is None and pending.returncode in (0, None)
                        and os.path.exists(pending.job.staged_path))
            if not exported:
                return self._finish(pending, status)
            _close(pending.status_fd, pending.pidfd)
            pending.stage, pending.pid, pending.pidfd, pending.status_fd = Stage.STAGED, None, None, None
        if pending.stage is Stage.STAGED:
            if self._stopping or self._hand_off is None:
                return self._finish(pending, PublishStatus(
                    trace_path=pending.job.trace_path, rank=pending.job.rank,
                    error="stopped before a publisher started" if self._stopping else "no publisher"))
            outcome = self._hand_off(pending)
            if outcome is not None:
                return self._finish(pending, outcome)
        self._waited(pending, deadline)
        return self._finish(pending)

    def _waited(self, pending: Pending, deadline: float) -> bool:
        """Wait for the current process until ``deadline``, stopping it then; True if it ended in time."""
        if _wait(pending, deadline):
            return True
        logger.error("rank %d: publishing %s took longer than --torch-profile-flush-timeout "
                     "(%.0f s); stopping it", self.rank, pending.job.trace_path, self.timeout)
        _terminate(pending)
        return False

    def _finish(self, pending: Pending, status: PublishStatus | None = None) -> None:
        if status is None and pending.status_fd is not None:
            status = read_status(pending.status_fd)
        if status is None:
            status = PublishStatus(trace_path=pending.job.trace_path, rank=pending.job.rank,
                                   error=_reason(pending))
        if status.cpu is not None and pending.export_cpu:
            status.cpu.export = pending.export_cpu  # a fork server's worker did not see the export
        _close(pending.status_fd, pending.pidfd, pending.worker.pidfd if pending.worker else None)
        remove_job_files(pending.job, pending.job_path)
        with self._lock:
            self._in_flight.pop(id(pending), None)
        try:
            self._on_done(pending, status)
        finally:
            pending.done.set()


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _reason(pending: Pending) -> str:
    """Why a process that sent no status ended, with the staging space when it is low."""
    code = pending.returncode
    who = "the fork server's publisher" if pending.stage is Stage.SERVED else "the exporter/publisher"
    if code is None:
        reason = f"{who} did not finish"
    elif code < 0:
        reason = f"{who} (pid {pending.pid}) was killed by {signal.Signals(-code).name}"
    elif code == EXIT_EXPORT_FAILED:
        reason = "the export in the forked child failed and could not report why"
    elif code == EXIT_REJECTED:
        reason = "the publisher rejected its job"
    else:
        reason = f"{who} exited with code {code} without a status"
    staging = Path(pending.job.staged_path).parent
    free_mb = free_disk_bytes(staging) / (1 << 20)
    if free_mb < 64:
        reason += f" (staging {staging} has {free_mb:.1f} MB free: is it full?)"
    return reason


def _wait(pending: Pending, deadline: float) -> bool:
    """Wait (without holding the GIL) until the process exits or ``deadline``; True if it exited."""
    if pending.stage is Stage.SERVED and pending.server is not None and pending.worker is not None:
        ended = pending.server.wait_worker(pending.worker, deadline)
        if ended is None:
            return False
        pending.returncode = ended[0]
        return True
    if pending.popen is not None:
        try:
            pending.returncode = pending.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    assert pending.pid is not None  # noqa: S101 - a child process: EXPORTING or PUBLISHING
    while True:
        try:
            done, status, usage = os.wait4(pending.pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (e.g. SIGCHLD ignored by the application)
            return True
        if done:
            pending.returncode = os.waitstatus_to_exitcode(status)
            if pending.stage is Stage.EXPORTING:
                pending.export_cpu = usage.ru_utime + usage.ru_stime
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
