"""The training-process side of the export: hand a stopped trace to a publisher, reap it.

Per trace, :class:`~torchprof_args.runtime.export.plan.ExportPlanner` chooses the staging
directory and the mode from the memory and space free at that moment.  ``fork``: a child
(:mod:`~torchprof_args.runtime.export.child`) exports and becomes the publisher (a failed fork:
inline).  ``inline``: the training thread exports, checks the file, and spawns the publisher (none
can start: it publishes in-process).  Either records the export's time in the job (the analysis budget).

With the publisher fork server (:mod:`~torchprof_args.runtime.export.forkserver`,
``--torch-profile-publisher-server``, started with the writer) the forked child only exports, and
the reaper thread hands the staged trace to a worker of the server (after an inline export too);
once the server is gone, each trace starts a publisher process again.

On a node whose cores were busy since the last flush (``--torch-profile-publish-wait auto``,
:mod:`~torchprof_args.runtime.export.idle_cpu`), :meth:`TraceWriter.submit` then waits for the publication,
at most ``--torch-profile-publish-wait-timeout``: a background publication there would only take
its CPU time from the next steps (docs/design/export-path.md).

A :class:`~torchprof_args.runtime.export.reaper.Reaper` thread waits on the processes, logs each
outcome with the rank and removes leftovers.  Every failure is logged with the rank and reason,
leaves nothing behind, and never reaches training; :meth:`TraceWriter.submit` returns which way the
trace went (:class:`Submission`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from torchprof_args.atomic import partial_path
from torchprof_args.log import get_logger
from torchprof_args.naming import (
    EXECUTION_TRACE_SUFFIX,
    TRACE_SUFFIX,
    companion_relpath,
    cycle_dir_name,
    operator_table_path,
    sidecar_path,
    trace_file_name,
    trace_stem,
)
from torchprof_args.runtime.config import ExportConfig
from torchprof_args.runtime.export.child import Companion, check_export, fork_export, remove_export_leftovers
from torchprof_args.runtime.export.idle_cpu import IdleCpuProbe, node_was_busy
from torchprof_args.runtime.export.job import PublishJob
from torchprof_args.runtime.export.plan import ExportPlanner
from torchprof_args.runtime.export.priority import IDLE, leave_idle_policy
from torchprof_args.runtime.export.progress import PublishProgress
from torchprof_args.runtime.export.publisher import publish, publisher_env
from torchprof_args.runtime.export.publishers import Publishers
from torchprof_args.runtime.export.reaper import Pending, Reaper, Stage, remove_job_files
from torchprof_args.runtime.export.staging import StagingArea
from torchprof_args.runtime.export.status import PublishStatus

__all__ = ["Route", "Submission", "TraceWriter"]

logger = get_logger(__name__)

#: A fork slower than this (seconds) is reported once: an ordinary one takes milliseconds (page
#: tables only, ~10 ms per 1 GB of touched memory), but pages pinned with cudaHostRegister are
#: copied (docs/gpu-validation.md: 2.3 s for 8 GB, 11.9 s for 32 GB on an H200 node).
SLOW_FORK_S = 1.0

#: ``(staged path, path in the trace's cycle folder, gzip level or None)``: files published with a trace
#: (``naming.companion_relpath``: not beside the traces, which HTA would read as traces).
ExtraFile = tuple[str, str, "int | None"]


class Route(enum.Enum):
    """Which way a submitted trace went."""

    #: A forked child exports it and becomes its publisher (or, with the fork server, hands it to
    #: the server's worker); the reaper watches those processes.
    FORKED = "forked"
    #: Exported on the training thread (asked, memory short, or the fork failed); the reaper
    #: watches the publisher process (or hands the trace to the fork server's worker).
    INLINE = "inline"
    #: Exported and published on the training thread: no publisher process could start.
    IN_PROCESS = "published in process"
    #: Not exported (the writer is closing, or the export failed; logged, nothing left behind).
    DROPPED = "dropped"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Submission:
    """The outcome of :meth:`TraceWriter.submit`."""

    route: Route
    #: Where the trace is (being) published; None when it was dropped before a job existed.
    trace_path: str | None = None
    #: FORKED, INLINE: the exporter/publisher process the reaper now watches (None: INLINE, the
    #: reaper hands the staged trace to the fork server's worker).
    pid: int | None = None
    #: FAILED, DROPPED, or IN_PROCESS when publishing failed: why.
    error: str | None = None
    #: FORKED, INLINE: the reaper follows the trace (its outcome is logged when published).
    watched: bool = False

    @property
    def pending(self) -> bool:
        """The trace is still being published (its outcome is logged when it is)."""
        return self.watched


class TraceWriter:
    """Hands finished traces to publisher processes and reaps them off the training thread.

    ``staging`` must be open (:meth:`StagingArea.open`); the writer closes it in :meth:`close`.
    """

    def __init__(self, output_dir: str | os.PathLike[str], staging: StagingArea, config: ExportConfig, *,
                 rank: int, planner: ExportPlanner | None = None,
                 idle_cpu: IdleCpuProbe | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.staging = staging
        self.config = config
        self.rank = rank
        mode = config.mode if hasattr(os, "fork") else "inline"
        self.planner = planner or ExportPlanner(mode, staging, config.min_free_host_mb << 20)
        #: ``publish_cpu_seconds``: the last publisher process's CPU time (status.PublishCpu).
        self.stats: dict[str, float] = {"traces_written": 0, "trace_mb": 0.0, "publish_seconds": 0.0,
                                        "publish_cpu_seconds": 0.0, "publish_failures": 0,
                                        "publications_waited_for": 0, "publication_waits_timed_out": 0}
        self.published: list[str] = []
        #: Totals for the publishing vote (backpressure, rank 0's line per cycle).
        self.progress = PublishProgress()
        self.accepting = True
        #: Where a trace's publisher comes from: the fork server, a process per trace, or here.
        self.publishers = Publishers(self.output_dir, staging, config, rank)
        self._reaper = Reaper(rank, config.flush_timeout, self._on_reaped, hand_off=self.publishers.hand_off)
        self._warned_slow_fork = False
        #: ``--torch-profile-publish-wait auto``: the node's idle cores since the last flush.
        self._idle_cpu = (idle_cpu or IdleCpuProbe()) if config.publish_wait == "auto" else None
        if self._idle_cpu is not None:
            self._idle_cpu.mark()

    @property
    def in_flight(self) -> int:
        return self._reaper.in_flight


    # -- submitting ------------------------------------------------------------------------

    def job_for(self, cycle: str, stem: str, staging: Path,
                extra_files: Sequence[ExtraFile] = (), memory: bool = False) -> PublishJob:
        """The job of ``stem``'s trace of ``cycle``: ``<output>/<cycle>/<stem>.pt.trace.json.gz``, its
        summary sidecar and operator table in ``<output>/<cycle>/summaries/`` (naming.trace_relpath);
        ``memory``: the exporter writes PyTorch's memory categorisation to a staged companion."""
        gzip_level, rows = self.config.gzip_level, self.config.operator_table_rows
        folder = self.output_dir / cycle
        trace_path = folder / trace_file_name(stem, gzip=gzip_level is not None)
        return PublishJob(
            staged_path=str(staging / f"{cycle}_{stem}{TRACE_SUFFIX}"),  # staging is flat: rank and cycle
            trace_path=str(trace_path),
            gzip_level=gzip_level,
            operator_table_path=str(operator_table_path(trace_path)) if rows else None,
            operator_table_rows=rows or 0,
            rank=self.rank,
            extra_files=[(staged, str(folder / name), level) for staged, name, level in extra_files],
            sidecar_path=str(sidecar_path(trace_path)) if rows else None,
            memory_path=str(staging / f"{cycle}_{stem}.memory.json") if memory and rows else None,
            analysis_budget=self.config.analysis_budget,
        )

    def submit_window(self, export: Callable[[str], None], first: int, last: int,
                      execution_trace: Path | None = None,
                      companion: Companion | None = None) -> Submission:
        """Publish the trace of the window that recorded iterations ``first..last`` (its cycle folder
        and this rank's stem from :mod:`~torchprof_args.naming`), with the window's execution trace
        (a finished file in staging) beside it when there is one; ``companion``: what a forked
        exporter runs after the trace (:func:`~.child.fork_export`)."""
        stem = trace_stem(self.rank)
        level = self.config.gzip_level
        extra: list[ExtraFile] = []
        if execution_trace is not None:
            relpath = companion_relpath(stem, EXECUTION_TRACE_SUFFIX, gzip=level is not None)
            extra.append((str(execution_trace), relpath, level))
        return self.submit(export, cycle_dir_name(first, last), stem, steps=last - first + 1,
                           extra_files=extra, companion=companion)

    def submit(self, export: Callable[[str], None], cycle: str, stem: str, steps: int = 1,
               extra_files: Sequence[ExtraFile] = (),
               companion: Companion | None = None) -> Submission:
        """Export a stopped profiler's trace of ``cycle`` (``naming.cycle_dir_name``) via
        ``export(path)`` and publish it in the background; returns which way it went.

        ``steps``: recorded steps (sizes the next estimate).  ``extra_files`` are published with
        the trace; they must already lie in one of ``staging.dirs``.  Never raises: failures are
        logged with the rank and training goes on.
        """
        name = f"{cycle}/{stem}"
        if not self.accepting:
            logger.warning("rank %d: trace %s dropped: the process is shutting down", self.rank, name)
            return Submission(Route.DROPPED, error="the process is shutting down")
        plan = self.planner.plan(steps)
        if plan.note:
            logger.warning("rank %d: trace %s: %s", self.rank, name, plan.note)
        job, job_path = self._job_file(plan.staging, cycle, stem, extra_files,
                                       memory=companion is not None and plan.mode == "fork")
        try:
            job.save(job_path)
            pending = self._fork(export, job, job_path, steps, companion) if plan.mode == "fork" else None
            if pending is None and plan.mode == "fork":  # the fork failed: inline, on disk
                remove_job_files(job, job_path)
                plan = self.planner.fallback(steps)
                job, job_path = self._job_file(plan.staging, cycle, stem, extra_files)
                job.save(job_path)
            route = Route.FORKED if pending is not None else Route.INLINE
            if pending is None:
                job = self._export_inline(export, job)
                job.save(job_path)
                if self.publishers.serving and self._reaper.start():  # its thread hands it to the server
                    pending = Pending(None, job, job_path, steps, None, stage=Stage.STAGED)
                else:
                    pending = self._spawn_publisher(job, job_path, steps)
                if pending is None:
                    return self._publish_here(job, job_path, steps)
        except Exception as err:
            remove_job_files(job, job_path)
            self._count_failure(job.trace_path)
            logger.error("rank %d: could not export trace %s: %s: %s; training continues",
                         self.rank, name, type(err).__name__, err)
            return Submission(Route.FAILED, job.trace_path, error=f"{type(err).__name__}: {err}")
        self._reaper.watch(pending)
        pid = pending.pid  # the process it was handed to (a fork server's worker takes it later)
        if self._waits(name):
            self._wait(pending, name)
        if self._idle_cpu is not None:
            self._idle_cpu.mark()  # the next window's stretch starts once this flush is done
        return Submission(route, job.trace_path, pid=pid, watched=True)

    def _waits(self, name: str) -> bool:
        """Whether this flush waits for its publication (``--torch-profile-publish-wait``)."""
        if self.config.publish_wait != "auto":
            return self.config.publish_wait == "always"
        return self._idle_cpu is not None and node_was_busy(self._idle_cpu, self.rank, name)

    def _wait(self, pending: Pending, name: str) -> None:
        """Hold the training thread until ``pending`` is published, or the wait's timeout."""
        timeout = self.config.publish_wait_timeout
        if self._reaper.wait_for(pending, time.monotonic() + timeout):
            self.stats["publications_waited_for"] += 1
            return
        self.stats["publication_waits_timed_out"] += 1
        logger.debug("rank %d: %s not published within the %.1f s wait; it goes on in the background",
                     self.rank, name, timeout)

    def _job_file(self, staging: Path, cycle: str, stem: str, extra_files: Sequence[ExtraFile],
                  memory: bool = False) -> tuple[PublishJob, str]:
        """The job of ``cycle``'s trace and its file's path in ``staging``."""
        job = self.job_for(cycle, stem, staging, extra_files, memory)
        return job, str(staging / f"{cycle}_{stem}.job.json")

    def _fork(self, export: Callable[[str], None], job: PublishJob, job_path: str,
              steps: int, companion: Companion | None = None) -> Pending | None:
        """Fork the exporter; None when the fork itself fails (logged; the caller goes inline).

        With the fork server, the child exits once the trace is staged (then the reaper hands it
        to a worker of the server); else it ``exec``\\ s the publisher."""
        read_fd, write_fd = os.pipe()
        serving = self.publishers.serving
        argv = None if serving else self.publishers.argv(job_path, write_fd)
        started = time.monotonic()
        try:
            pid = fork_export(export, job, job_path, argv, publisher_env(),
                              keep_fds=(write_fd, *self.staging.lock_fds), companion=companion,
                              background=self.config.publisher_priority == IDLE)
            self._note_fork_time(time.monotonic() - started)
        except OSError as err:
            os.close(read_fd)
            logger.warning("rank %d: fork failed (%s); exporting %s inline on the training thread instead",
                           self.rank, err.strerror or err, Path(job.trace_path).name)
            return None
        finally:
            os.close(write_fd)
        return Pending(pid, job, job_path, steps, read_fd,
                       stage=Stage.EXPORTING if serving else Stage.PUBLISHING)

    def _note_fork_time(self, seconds: float) -> None:
        """Warn once when ``fork()`` itself held the training thread for long (see SLOW_FORK_S)."""
        if seconds < SLOW_FORK_S or self._warned_slow_fork:
            return
        self._warned_slow_fork = True
        logger.warning(
            "rank %d: fork() for the trace export held the training thread for %.1f s. Host memory "
            "pinned in place with cudaHostRegister (e.g. "
            "PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True) is copied at every fork "
            "(measured 0.37 s per GB on an H200 node); memory from pin_memory=True is not. Pin with "
            "pin_memory=True, or use --torch-profile-export inline if the trace exports faster than that",
            self.rank, seconds)

    @staticmethod
    def _export_inline(export: Callable[[str], None], job: PublishJob) -> PublishJob:
        """Export on this thread to a hidden name, check, rename to the staged path; the job, timed."""
        staged_tmp = partial_path(job.staged_path)
        started = time.thread_time()  # CPU, as the forked exporter measures it
        try:
            export(str(staged_tmp))
            check_export(staged_tmp)
            os.replace(staged_tmp, job.staged_path)
        except BaseException:
            remove_export_leftovers(staged_tmp)
            raise
        return dataclasses.replace(job, export_seconds=time.thread_time() - started)

    def _spawn_publisher(self, job: PublishJob, job_path: str, steps: int) -> Pending | None:
        """Start the publisher of an exported trace; None when no process can start (logged)."""
        started = self.publishers.start_process(job, job_path, "on the training thread")
        if started is None:
            return None
        popen, read_fd = started
        return Pending(popen.pid, job, job_path, steps, read_fd, popen=popen)

    def _publish_here(self, job: PublishJob, job_path: str, steps: int) -> Submission:
        """Publish on the training thread (no process could start) and record the outcome now."""
        started = time.monotonic()
        status = publish(job)
        remove_job_files(job, job_path)
        self._record(job, steps, started, status)
        return Submission(Route.IN_PROCESS, job.trace_path, error=status.error)

    # -- outcomes --------------------------------------------------------------------------

    def _count_failure(self, trace_path: str | None = None) -> None:
        self.stats["publish_failures"] += 1
        self.progress.add(trace_path or "", ok=False)

    def _on_reaped(self, pending: Pending, status: PublishStatus) -> None:
        """The reaper's callback (on its thread) when a publisher process ended."""
        self._record(pending.job, pending.steps, pending.started, status)

    def _record(self, job: PublishJob, steps: int, started: float, status: PublishStatus) -> None:
        """Learn the trace's size, count and log the outcome of ``job`` (``started``: monotonic,
        when it was handed over)."""
        trace_path = job.trace_path
        if status.raw_mb is not None:
            self.planner.learn(status.raw_mb * 1e6, steps)
        if status.error is not None:
            self._count_failure(trace_path)
            logger.error("rank %d: trace %s was not written: %s", self.rank, trace_path, status.error)
            return
        trace_mb = status.trace_mb or 0.0
        self.stats.update(traces_written=self.stats["traces_written"] + 1, trace_mb=trace_mb,
                          publish_seconds=status.publish_seconds)
        if status.cpu is not None:
            self.stats["publish_cpu_seconds"] = status.cpu.total
        self.published.append(trace_path)
        seconds = time.monotonic() - started
        self.progress.add(trace_path, ok=True, megabytes=trace_mb, seconds=seconds)
        # DEBUG: at 512 ranks, rank 0's one line per cycle says it (runtime/publish_vote.py)
        logger.debug("rank %d: trace written to %s (%.1f MB, %.1f s after the flush)", self.rank,
                     trace_path, trace_mb, seconds)
        if status.summary_error is not None:
            logger.warning("rank %d: summary error for %s: %s", self.rank, trace_path, status.summary_error)
        if status.left_out:  # by design: one line on rank 0, not one per rank
            left = "; ".join(f"{part} ({why})" for part, why in status.left_out.items())
            logger.log(logging.INFO if self.rank == 0 else logging.DEBUG, "rank %d: %s: left out of its "
                       "sidecar (the tools compute them from the trace): %s", self.rank, trace_path, left)
        if status.extra_errors:
            logger.warning("rank %d: extra errors for %s: %s", self.rank, trace_path, status.extra_errors)

    # -- the end ---------------------------------------------------------------------------

    def close(self, deadline: float | Callable[[], float], why: str) -> None:
        """Stop accepting traces, wait for pending ones until ``deadline`` (monotonic, or a callable
        asked again while waiting), stop the rest (their partial files removed), remove staging."""
        self.accepting = False
        count = self.in_flight
        if self.config.publisher_priority == IDLE:  # training is over: nothing to yield the CPU to
            self.publishers.leave_idle_policy()
            for pending in self._reaper.pending():
                if pending.pid is not None:
                    leave_idle_policy(pending.pid)
        current = deadline if callable(deadline) else (lambda: deadline)
        if count and current() > time.monotonic():
            level = logging.INFO if self.rank == 0 else logging.DEBUG  # one line, not one per rank
            logger.log(level, "rank %d: waiting up to %.0f s for %d trace(s) to be published", self.rank,
                       current() - time.monotonic(), count)
        if not self._reaper.wait_all(current):
            logger.error("rank %d: %d trace(s) not published within %s; stopping them", self.rank,
                         self.in_flight, why)
            self._reaper.stop_all()
        self._reaper.close()
        self.publishers.close()
        self.staging.close()

    def abandon(self) -> None:
        """From a watchdog thread while the training thread is stuck: stop every process now and
        remove their files and the staging directories."""
        self.accepting = False
        self._reaper.stop_all()
        self.publishers.kill()
        self.staging.close()
