"""Every publication of one rank, and its publisher, owned by one thread.

A flushed trace is handed over twice: exported (by a forked child, which only exports and exits, or
inline on the training thread), then published by the rank's publisher
(:mod:`~torchprof_args.capture.runtime.export.publisher`): one long-lived process, started with the writer at
``--torch-profile-publisher-priority``, fed one job line at a time on its stdin, answering one status
line per job on its stdout.  :class:`Publications` does all of it on its own thread: it starts the
publisher (again after one died), waits on the forked exporters, feeds the publisher one trace at a
time, reads its answers, enforces ``--torch-profile-flush-timeout``, removes what a failed trace
left and logs each outcome with the rank (through ``on_outcome``).  The training thread only posts
work and holds a :class:`concurrent.futures.Future` per trace (the publish wait, the exit's wait).

Every failure costs one trace: an exporter or the publisher killed, a publisher that does not answer
in time (stopped), one that cannot start (the trace is not published in the training process).  The
trace's staged and partial files are removed and one line names the rank and the reason; the next
trace starts a new publisher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export.child import Exporter
from torchprof_args.capture.runtime.export.job import EXIT_EXPORT_FAILED, JobRejected, PublishJob
from torchprof_args.capture.runtime.export.priority import NORMAL, leave_idle_policy
from torchprof_args.capture.runtime.export.publisher import PublisherProcess
from torchprof_args.capture.runtime.export.staging import StagingArea
from torchprof_args.capture.runtime.export.status import PublishStatus, ended_how
from torchprof_args.capture.runtime.host_resources import free_disk_bytes
from torchprof_args.log import get_logger

__all__ = ["Publication", "Publications"]

logger = get_logger(__name__)

#: The bounded waits of :meth:`Publications.stop_all` and :meth:`Publications.close`.
_STOP_SECONDS = 8.0
#: The longest wait between looks at an exporter where the platform has no pidfd.
_POLL_SECONDS = 0.05


@dataclasses.dataclass(eq=False)
class Publication:
    """One trace from its hand-over to its outcome (changed on the publications thread only)."""

    job: PublishJob
    steps: int
    #: The job file a forked exporter saves with the export's CPU time (None: exported inline).
    job_path: str | None = None
    #: The forked exporter while it runs.
    exporter: Exporter | None = None
    #: Monotonic, at the flush; and when the publisher got it (``--torch-profile-flush-timeout`` counts
    #: from each: for its exporter, and for its publisher).
    started: float = dataclasses.field(default_factory=time.monotonic)
    handed: float = 0.0
    export_cpu: float = 0.0
    future: Future[PublishStatus] = dataclasses.field(default_factory=Future)


class Publications:
    """One rank's publications and publisher, on one thread (see the module docstring).

    ``on_outcome(publication, status)`` runs on that thread once per trace, before its future is set.
    Raises ``RuntimeError`` when no thread can start, ``OSError`` when no pipe can be made.
    """

    def __init__(self, output_dir: Path, staging: StagingArea, config: ExportConfig, rank: int,
                 on_outcome: Callable[[Publication, PublishStatus], None]) -> None:
        self.output_dir = output_dir
        self.staging = staging
        self.config = config
        self.rank = rank
        self._on_outcome = on_outcome
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # the thread's own from here on
        self._waiting: list[Publication] = []  # exporting, or staged for the publisher, in order
        self._current: Publication | None = None  # with the publisher
        self._publisher: PublisherProcess | None = None
        self._idle_left = False
        self._running = True
        self._thread = threading.Thread(target=self._run, name="torchprof-publications", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            self._close_wake()
            raise
        self._post(self._start_early)

    # -- from the training thread (or a watchdog) ------------------------------------------

    def forked(self, job: PublishJob, job_path: str, steps: int,
               exporter: Exporter) -> Future[PublishStatus]:
        """Follow the forked ``exporter`` of ``job`` (which saves it to ``job_path``), then publish the
        trace; the future's result is its outcome."""
        publication = Publication(job, steps, job_path, exporter)
        self._post(lambda: self._waiting.append(publication))
        return publication.future

    def staged(self, job: PublishJob, steps: int) -> Future[PublishStatus]:
        """Publish ``job``'s trace, exported inline; the future's result is its outcome."""
        publication = Publication(job, steps)
        self._post(lambda: self._waiting.append(publication))
        return publication.future

    def leave_idle_policy(self) -> None:
        """At exit: the publisher and exporters still running leave SCHED_IDLE (``leave_idle_policy``)."""
        self._post(self._leave_idle)

    def stop_all(self, why: str) -> None:
        """Stop every trace not published yet (each logged, its files removed); waits (bounded)."""
        done = threading.Event()

        def stop() -> None:
            try:
                self._stop_all(why)
            finally:
                done.set()

        self._post(stop)
        done.wait(_STOP_SECONDS)

    def close(self) -> None:
        """End the publisher (its input ends) and the thread; traces not finished are stopped."""
        self._post(self._shut_down)
        self._thread.join(timeout=_STOP_SECONDS)
        if not self._thread.is_alive():
            self._close_wake()

    def _post(self, call: Callable[[], None]) -> None:
        self._calls.put(call)
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"\0")

    def _close_wake(self) -> None:
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while self._running:
            try:
                self._turn()
            except Exception as err:  # noqa: BLE001 - the thread must live on to finish the other traces
                logger.error("rank %d: publications: %s: %s", self.rank, type(err).__name__, err)
                time.sleep(_POLL_SECONDS)

    def _turn(self) -> None:
        """Run what was posted, follow the exporters, feed the publisher, then wait for news."""
        with contextlib.suppress(queue.Empty):
            while self._running:
                self._calls.get_nowait()()
        if not self._running:
            return
        self._follow_exporters()
        self._feed()
        now, current = time.monotonic(), self._current
        if current is not None and now >= current.handed + self.config.flush_timeout:
            self._stop_publisher()
            self._current = None
            self._finish(current, PublishStatus(error=(
                f"not published within --torch-profile-flush-timeout ({self.config.flush_timeout:g} s): its "
                "publisher was stopped, the next trace starts a new one")))
            return
        fds, deadlines = [self._wake_read], []
        for publication in self._waiting:
            if publication.exporter is not None:
                deadlines.append(publication.started + self.config.flush_timeout)
                if publication.exporter.pidfd is not None:
                    fds.append(publication.exporter.pidfd)
                else:
                    deadlines.append(now + _POLL_SECONDS)
        if self._publisher is not None:
            fds.append(self._publisher.output)
        if current is not None:
            deadlines.append(current.handed + self.config.flush_timeout)
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        readable, _, _ = select.select(fds, [], [], timeout)
        if self._wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_read, 4096):
                    pass
        if self._publisher is not None and self._publisher.output in readable:
            self._read_replies()

    def _start_early(self) -> None:
        """Start the publisher with the writer: its imports are paid while training starts."""
        error = self._start_publisher()
        if error is not None:
            logger.warning("rank %d: cannot start the publisher (%s); each trace tries again", self.rank,
                           error)

    def _start_publisher(self) -> str | None:
        """Start the rank's publisher; returns why it could not start, None when it did."""
        priority = NORMAL if self._idle_left else self.config.publisher_priority
        try:
            dirs, locks = [str(d) for d in self.staging.dirs], self.staging.lock_fds
            self._publisher = PublisherProcess.start(dirs, str(self.output_dir), priority, locks)
        except OSError as err:
            return err.strerror or str(err)
        return None

    def _feed(self) -> None:
        """Hand the first staged trace to the publisher when it has none (starting one if needed)."""
        while self._current is None:
            publication = next((p for p in self._waiting if p.exporter is None), None)
            if publication is None:
                return
            self._waiting.remove(publication)
            error = self._start_publisher() if self._publisher is None else None
            if self._publisher is None:
                why = f"no publisher could be started ({error}); it is not published in the training process"
                self._finish(publication, PublishStatus(error=why))
                continue
            self._current, publication.handed = publication, time.monotonic()
            self._publisher.send(publication.job)

    def _read_replies(self) -> None:
        assert self._publisher is not None  # noqa: S101 - called when its output is readable
        answers = self._publisher.replies()
        if answers is None:
            self._publisher_ended()
            return
        for status in answers:
            current, self._current = self._current, None
            if current is not None:
                self._finish(current, status)

    def _publisher_ended(self) -> None:
        """Its output ended: it died.  The trace it had fails; the next trace starts a new one."""
        publisher, self._publisher = self._publisher, None
        assert publisher is not None  # noqa: S101 - called when its output ended
        what = f"its publisher (pid {publisher.pid}) {publisher.ended()}; the next trace starts a new one"
        current, self._current = self._current, None
        if current is not None:
            self._finish(current, PublishStatus(error=what))
        else:
            logger.warning("rank %d: %s", self.rank, what.replace("its publisher", "the publisher", 1))

    def _stop_publisher(self) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.stop()

    def _follow_exporters(self) -> None:
        """Reap the forked exporters that ended (staged: their job file has the export's CPU time) and
        stop those past the flush timeout."""
        for publication in list(self._waiting):
            exporter = publication.exporter
            if exporter is None:
                continue
            ended, status = exporter.reap(), None
            if ended is None:
                if time.monotonic() < publication.started + self.config.flush_timeout:
                    continue
                exporter.kill()
                ended, status = exporter.reap(block=True), PublishStatus(error=(
                    f"its export did not finish within --torch-profile-flush-timeout "
                    f"({self.config.flush_timeout:g} s); stopped"))
            code, cpu = ended or (None, 0.0)
            status = status or exporter.status()
            exporter.close()
            publication.exporter = None
            if status is None and code in (0, None) and os.path.exists(publication.job.staged_path):
                try:
                    dirs = [str(d) for d in self.staging.dirs]
                    publication.job = PublishJob.load(publication.job_path or "", dirs, str(self.output_dir))
                    publication.export_cpu = cpu
                    continue  # staged: _feed hands it over
                except JobRejected as err:
                    status = PublishStatus(error=str(err))
            self._waiting.remove(publication)
            status = status or PublishStatus(error=_export_failed(publication, exporter, code))
            self._finish(publication, status)

    def _finish(self, publication: Publication, status: PublishStatus) -> None:
        """The trace's outcome: its leftovers removed, ``on_outcome`` told, its future set."""
        job = publication.job
        status.trace_path = status.trace_path or job.trace_path
        status.rank = job.rank if status.rank is None else status.rank
        if status.cpu is not None and publication.export_cpu:
            status.cpu.export = publication.export_cpu  # the publisher did not see the export
        if publication.exporter is not None:
            publication.exporter.close()
            publication.exporter = None
        job.remove_leftovers(publication.job_path)
        try:
            self._on_outcome(publication, status)
        finally:
            publication.future.set_result(status)

    def _stop_all(self, why: str) -> None:
        for publication in self._waiting:
            if publication.exporter is not None:
                publication.exporter.kill()
                publication.exporter.reap(block=True)
        if self._current is not None:
            self._stop_publisher()
        stopped = [*self._waiting, *([self._current] if self._current is not None else [])]
        self._waiting, self._current = [], None
        for publication in stopped:
            self._finish(publication, PublishStatus(error=f"not published within {why}; stopped"))

    def _leave_idle(self) -> None:
        self._idle_left = True
        pids = [p.exporter.pid for p in self._waiting if p.exporter is not None]
        for pid in pids + ([self._publisher.pid] if self._publisher is not None else []):
            leave_idle_policy(pid)

    def _shut_down(self) -> None:
        """Stop what is left, end the publisher's input (it exits), end the thread."""
        if self._waiting or self._current is not None:
            self._stop_all("the writer's close")
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()
        self._running = False


def _export_failed(publication: Publication, exporter: Exporter, code: int | None) -> str:
    """Why an exporter that sent no status failed, with the staging space when it is low."""
    if code == EXIT_EXPORT_FAILED:
        reason = "the export in the forked child failed and could not report why"
    else:
        reason = f"its exporter (pid {exporter.pid}) {ended_how(code)}"
    staging = Path(publication.job.staged_path).parent
    free_mb = free_disk_bytes(staging) / (1 << 20)
    if free_mb < 64:
        reason += f" (staging {staging} has {free_mb:.1f} MB free: is it full?)"
    return reason
