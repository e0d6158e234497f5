"""The training-process side of the export: hand a stopped trace to a publisher, reap it.

The training thread pays only for ``stop()`` and, with ``mode="inline"``, the serialisation;
:mod:`~torchprof_args.runtime.export.child` (fork mode) and
:mod:`~torchprof_args.runtime.export.publisher` do the rest in other processes.  A reaper thread
waits on each publisher (without holding the GIL), logs the outcome with the rank, enforces
timeouts and removes whatever a killed publisher left in staging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchprof_args.atomic import partial_path
from torchprof_args.log import get_logger
from torchprof_args.naming import SUMMARY_SUFFIX, TRACE_SUFFIX, companion_file_name, trace_file_name
from torchprof_args.runtime.config import ExportConfig
from torchprof_args.runtime.export.child import fork_export
from torchprof_args.runtime.export.publisher import PublishJob, publisher_argv, publisher_env

__all__ = ["TraceWriter"]

logger = get_logger(__name__)


@dataclasses.dataclass
class _Pending:
    pid: int
    job: PublishJob
    job_path: str
    started: float
    popen: subprocess.Popen[bytes] | None = None


class TraceWriter:
    """Hands finished traces to publisher processes and reaps them off the training thread."""

    def __init__(self, output_dir: str | os.PathLike[str], staging_dir: Path, config: ExportConfig, *,
                 rank: int) -> None:
        self.output_dir = Path(output_dir)
        self.staging_dir = staging_dir
        self.config = config
        self.rank = rank
        self.export_mode = config.mode if hasattr(os, "fork") else "inline"
        self.publish_timeout = config.flush_timeout
        self.stats: dict[str, float] = {"traces_written": 0, "trace_mb": 0.0, "publish_seconds": 0.0,
                                        "publish_failures": 0}
        self.published: list[str] = []
        self._pending: queue.Queue[_Pending | None] = queue.Queue()
        self._in_flight: set[int] = set()
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None

    # -- submitting ------------------------------------------------------------------------

    def job_for(self, stem: str, companions: Sequence[tuple[str, str]] = ()) -> PublishJob:
        """The publisher's job for trace ``stem``; ``companions``: ``(staged path, suffix)`` to publish beside it."""
        gzip_level, summary_rows = self.config.gzip_level, self.config.summary_rows
        gzip = gzip_level is not None
        return PublishJob(
            staged_path=str(self.staging_dir / f"{stem}{TRACE_SUFFIX}"),
            trace_path=str(self.output_dir / trace_file_name(stem, gzip=gzip_level is not None)),
            status_path=str(self.staging_dir / f"{stem}.status.json"),
            gzip_level=gzip_level,
            summary_path=str(self.output_dir / f"{stem}{SUMMARY_SUFFIX}") if summary_rows else None,
            summary_rows=summary_rows or 0,
            rank=self.rank,
            companions=[[str(staged), str(self.output_dir / companion_file_name(stem, suffix, gzip))]
                        for staged, suffix in companions],
        )

    def submit(self, export: Callable[[str], None], stem: str, companions: Sequence[tuple[str, str]] = ()) -> None:
        """Export a stopped profiler's trace via ``export(path)`` and publish it in the background.

        ``companions`` are finished files in staging, ``(path, suffix)``, published beside the
        trace as ``<stem><suffix>[.gz]`` by the same publisher.  Never raises: failures are
        logged with the rank and training goes on.
        """
        try:
            job = self.job_for(stem, companions)
            job_path = str(self.staging_dir / f"{stem}.job.json")
            job.save(job_path)
            if self.export_mode == "fork":
                pid = fork_export(export, job, job_path)
                pending = _Pending(pid, job, job_path, time.monotonic())
            else:
                staged_tmp = partial_path(job.staged_path)
                export(str(staged_tmp))
                os.replace(staged_tmp, job.staged_path)
                popen = subprocess.Popen(
                    publisher_argv(job_path), env=publisher_env(), start_new_session=True,
                    stdin=subprocess.DEVNULL,
                )
                pending = _Pending(popen.pid, job, job_path, time.monotonic(), popen)
        except Exception as err:
            for staged, _ in companions:
                with contextlib.suppress(OSError):
                    os.unlink(staged)
            self.stats["publish_failures"] += 1
            logger.error("rank %d: could not export trace %s: %s: %s; training continues",
                         self.rank, stem, type(err).__name__, err)
            return
        with self._lock:
            self._in_flight.add(pending.pid)
        self._ensure_reaper()
        self._pending.put(pending)

    # -- reaping ---------------------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap_loop, name="torchprof-reaper", daemon=True)
            self._reaper.start()

    def _reap_loop(self) -> None:
        while True:
            pending = self._pending.get()
            if pending is None:
                return
            deadline = pending.started + self.publish_timeout
            if not _wait_pid(pending, deadline):
                logger.error("rank %d: publishing %s took longer than %.0f s; stopping it",
                             self.rank, pending.job.trace_path, self.publish_timeout)
                _terminate(pending)
            self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        status: dict[str, Any] = {"error": "publisher exited without a status"}
        with contextlib.suppress(OSError, ValueError):
            status = json.loads(Path(pending.job.status_path).read_text())
            os.unlink(pending.job.status_path)
        leftovers = [pending.job_path, pending.job.staged_path, partial_path(pending.job.staged_path),
                     partial_path(pending.job.trace_path)]
        if pending.job.summary_path:
            leftovers.append(partial_path(pending.job.summary_path))
        for staged, target in pending.job.companions:
            leftovers += [staged, partial_path(target)]
        for leftover in leftovers:  # only present if the publisher was killed
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        with self._lock:
            self._in_flight.discard(pending.pid)
            if "error" in status:
                self.stats["publish_failures"] += 1
            else:
                self.stats["traces_written"] += 1
                self.stats["trace_mb"] = status.get("trace_mb", 0.0)
                self.stats["publish_seconds"] = status.get("seconds", 0.0)
                self.published.append(status["trace_path"])
        if "error" in status:
            logger.error("rank %d: trace %s was not written: %s", self.rank, pending.job.trace_path,
                         status["error"])
            return
        logger.info("rank %d: trace written to %s (%.1f MB, %.1f s after the flush)", self.rank,
                    status["trace_path"], status.get("trace_mb", 0.0), time.monotonic() - pending.started)
        for companion in status.get("companions", []):
            logger.info("rank %d: %s written beside it", self.rank, companion)
        for error in status.get("companion_errors", []):
            logger.error("rank %d: not written beside %s: %s", self.rank, status["trace_path"], error)
        if "summary_error" in status:
            logger.warning("rank %d: no summary for %s: %s", self.rank, status["trace_path"],
                           status["summary_error"])

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for publishers; stop and clean up any still running."""
        if self._reaper is None:
            with contextlib.suppress(OSError):
                self.staging_dir.rmdir()
            return
        deadline = time.monotonic() + timeout
        if self.in_flight:
            logger.info("rank %d: waiting up to %.0f s for %d trace(s) to be published", self.rank,
                        timeout, self.in_flight)
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.in_flight:
            logger.error("rank %d: %d trace(s) not published within --torch-profile-exit-timeout "
                         "(%.0f s); stopping them", self.rank, self.in_flight, timeout)
            with self._lock:
                pids = list(self._in_flight)
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + 10
            while self.in_flight and time.monotonic() < end:
                time.sleep(0.05)
        self._pending.put(None)
        self._reaper.join(timeout=10)
        self._reaper = None
        with contextlib.suppress(OSError):
            self.staging_dir.rmdir()  # only succeeds when nothing was left behind


def _wait_pid(pending: _Pending, deadline: float) -> bool:
    """Wait (without holding the GIL) until the publisher exits or ``deadline``; True if it exited."""
    if pending.popen is not None:
        try:
            pending.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pending.pid)
    try:
        while True:
            try:
                done, _ = os.waitpid(pending.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped (e.g. SIGCHLD ignored by the application)
                return True
            if done:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if pidfd is not None:
                select.select([pidfd], [], [], min(remaining, 60.0))
            else:
                time.sleep(min(remaining, 0.1))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _terminate(pending: _Pending) -> None:
    with contextlib.suppress(OSError):
        os.kill(pending.pid, signal.SIGTERM)
    if not _wait_pid(pending, time.monotonic() + 10):
        with contextlib.suppress(OSError):
            os.kill(pending.pid, signal.SIGKILL)
        _wait_pid(pending, time.monotonic() + 10)

