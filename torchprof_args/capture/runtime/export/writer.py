"""The training-process side of the export: hand a stopped trace to the rank's publisher.

Per trace, :class:`~torchprof_args.capture.runtime.export.plan.ExportPlanner` chooses the staging
directory and the mode from the memory and space free at that moment.  ``fork``: a child
(:mod:`~torchprof_args.capture.runtime.export.child`) exports it to staging and exits.  ``inline`` (asked,
memory short, or the fork failed): the training thread exports and checks it; that is the only
fallback.  Either way the staged trace then goes to the rank's publisher, a long-lived process that
:class:`~torchprof_args.capture.runtime.export.publication.Publications` starts with the writer and feeds
on its own thread; the export's CPU time goes with the job (the analysis budget).

On a node whose cores were busy since the last flush (``--torch-profile-publish-wait auto``,
:mod:`~torchprof_args.capture.runtime.export.idle_cpu`), :meth:`TraceWriter.submit` then waits for
the publication, at most ``--torch-profile-publish-wait-timeout``: a background publication there
would only take its CPU time from the next steps (docs/design/export-path.md).

Every failure is logged with the rank and reason, leaves nothing behind, and never reaches
training; :meth:`TraceWriter.submit` returns which way the trace went (:class:`Submission`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path

from torchprof_args.atomic import partial_path
from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export.child import (
    Companion,
    Exporter,
    check_export,
    fork_export,
    remove_export_leftovers,
)
from torchprof_args.capture.runtime.export.idle_cpu import IdleCpuProbe, node_was_busy
from torchprof_args.capture.runtime.export.job import PublishJob
from torchprof_args.capture.runtime.export.plan import ExportPlanner
from torchprof_args.capture.runtime.export.priority import IDLE
from torchprof_args.capture.runtime.export.progress import PublishProgress
from torchprof_args.capture.runtime.export.publication import Publication, Publications
from torchprof_args.capture.runtime.export.staging import StagingArea
from torchprof_args.capture.runtime.export.status import PublishStatus
from torchprof_args.log import get_logger
from torchprof_args.naming import (
    EXECUTION_TRACE_SUFFIX,
    EXPERT_TOKENS_SUFFIX,
    TRACE_SUFFIX,
    companion_relpath,
    cycle_dir_name,
    operator_table_path,
    sidecar_path,
    trace_file_name,
    trace_stem,
)

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

    #: A forked child exported it; the rank's publisher publishes it (``Submission.outcome``).
    FORKED = "forked"
    #: Exported on the training thread (asked, memory short, or the fork failed); the rank's publisher
    #: publishes it (``Submission.outcome``).
    INLINE = "inline"
    #: Not handed to a publisher: the export failed, or the writer's publications thread could not
    #: start (logged with the rank and reason, nothing left behind).
    FAILED = "failed"
    #: Not exported: the writer is closing.
    DROPPED = "dropped"


@dataclasses.dataclass(frozen=True)
class Submission:
    """The outcome of :meth:`TraceWriter.submit`."""

    route: Route
    #: Where the trace is (being) published; None when it was dropped before a job existed.
    trace_path: str | None = None
    #: FAILED, DROPPED: why.
    error: str | None = None
    #: FORKED, INLINE: the publication's outcome, once it is known (published: its ``error`` is None).
    outcome: futures.Future[PublishStatus] | None = None


class TraceWriter:
    """Hands finished traces to the rank's publisher (:class:`Publications`, its own thread).

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
        #: ``publish_cpu_seconds``: the last publication's CPU time, export included (status.PublishCpu).
        self.stats: dict[str, float] = {"traces_written": 0, "trace_mb": 0.0, "publish_seconds": 0.0,
                                        "publish_cpu_seconds": 0.0, "publish_failures": 0,
                                        "publications_waited_for": 0, "publication_waits_timed_out": 0}
        self.published: list[str] = []
        #: Totals for the publishing vote (backpressure, rank 0's line per cycle).
        self.progress = PublishProgress()
        self.accepting = True
        #: Traces handed to the publisher whose outcome is not known yet (pruned when read).
        self._outcomes: list[futures.Future[PublishStatus]] = []
        #: The rank's publisher and every publication, on their own thread (None: it could not start).
        self.publications: Publications | None = None
        self._no_publications: str | None = None
        try:
            self.publications = Publications(self.output_dir, staging, config, rank, self._record)
        except (RuntimeError, OSError) as err:  # "can't start new thread" (a pids limit), no descriptors
            self._no_publications = f"no thread to publish it could start ({err})"
            logger.warning("rank %d: %s; traces will not be published", rank, self._no_publications)
        self._warned_slow_fork = False
        #: ``--torch-profile-publish-wait auto``: the node's idle cores since the last flush.
        self._idle_cpu = (idle_cpu or IdleCpuProbe()) if config.publish_wait == "auto" else None
        if self._idle_cpu is not None:
            self._idle_cpu.mark()

    @property
    def in_flight(self) -> int:
        """Traces handed over and not published (or failed) yet."""
        self._outcomes = [outcome for outcome in self._outcomes if not outcome.done()]
        return len(self._outcomes)

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
                      companion: Companion | None = None, expert_tokens: Path | None = None) -> Submission:
        """Publish the trace of the window that recorded iterations ``first..last`` (its cycle folder
        and this rank's stem from :mod:`~torchprof_args.naming`), with the window's execution trace
        and its tokens per expert (finished files in staging) beside it when there are; ``companion``:
        what a forked exporter runs after the trace (:func:`~.child.fork_export`)."""
        stem = trace_stem(self.rank)
        level = self.config.gzip_level
        extra: list[ExtraFile] = []
        if execution_trace is not None:
            relpath = companion_relpath(stem, EXECUTION_TRACE_SUFFIX, gzip=level is not None)
            extra.append((str(execution_trace), relpath, level))
        if expert_tokens is not None:  # small: kept plain JSON
            relpath = companion_relpath(stem, EXPERT_TOKENS_SUFFIX, gzip=False)
            extra.append((str(expert_tokens), relpath, None))
        return self.submit(export, cycle_dir_name(first, last), stem, steps=last - first + 1,
                           extra_files=extra, companion=companion)

    def submit(self, export: Callable[[str], None], cycle: str, stem: str, steps: int = 1,
               extra_files: Sequence[ExtraFile] = (),
               companion: Companion | None = None) -> Submission:
        """Export a stopped profiler's trace of ``cycle`` (``naming.cycle_dir_name``) via
        ``export(path)`` and hand it to the rank's publisher; returns which way it went (waits for the
        publication when ``--torch-profile-publish-wait`` says so).

        ``steps``: recorded steps (sizes the next estimate).  ``extra_files`` are published with
        the trace; they must already lie in one of ``staging.dirs``.  Never raises: failures are
        logged with the rank and training goes on.
        """
        name = f"{cycle}/{stem}"
        if not self.accepting:
            logger.warning("rank %d: trace %s dropped: the process is shutting down", self.rank, name)
            return Submission(Route.DROPPED, error="the process is shutting down")
        if self.publications is None:
            logger.error("rank %d: trace %s was not written: %s", self.rank, name, self._no_publications)
            self._count_failure()
            return Submission(Route.FAILED, error=self._no_publications)
        plan = self.planner.plan(steps)
        if plan.note:
            logger.warning("rank %d: trace %s: %s", self.rank, name, plan.note)
        job, job_path = self._job_file(plan.staging, cycle, stem, extra_files,
                                       memory=companion is not None and plan.mode == "fork")
        try:
            forked = None
            if plan.mode == "fork":
                job.save(job_path)
                forked = self._fork(export, job, job_path, companion)
                if forked is None:  # the fork failed: inline, on disk
                    job.remove_leftovers(job_path)
                    plan = self.planner.fallback(steps)
                    job, job_path = self._job_file(plan.staging, cycle, stem, extra_files)
            if forked is not None:
                route, outcome = Route.FORKED, self.publications.forked(job, job_path, steps, forked)
            else:
                job = self._export_inline(export, job)
                route, outcome = Route.INLINE, self.publications.staged(job, steps)
        except Exception as err:
            job.remove_leftovers(job_path)
            self._count_failure(job.trace_path)
            logger.error("rank %d: could not export trace %s: %s: %s; training continues",
                         self.rank, name, type(err).__name__, err)
            return Submission(Route.FAILED, job.trace_path, error=f"{type(err).__name__}: {err}")
        self._outcomes.append(outcome)
        if self._waits(name):
            self._wait(outcome, name)
        if self._idle_cpu is not None:
            self._idle_cpu.mark()  # the next window's stretch starts once this flush is done
        return Submission(route, job.trace_path, outcome=outcome)

    def _waits(self, name: str) -> bool:
        """Whether this flush waits for its publication (``--torch-profile-publish-wait``)."""
        if self.config.publish_wait != "auto":
            return self.config.publish_wait == "always"
        return self._idle_cpu is not None and node_was_busy(self._idle_cpu, self.rank, name)

    def _wait(self, outcome: futures.Future[PublishStatus], name: str) -> None:
        """Hold the training thread until the trace is published (or failed), or the wait's timeout."""
        timeout = self.config.publish_wait_timeout
        if futures.wait([outcome], timeout).done:
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
              companion: Companion | None = None) -> Exporter | None:
        """Fork the exporter; None when the fork itself fails (logged; the caller goes inline)."""
        started = time.monotonic()
        try:
            exporter = fork_export(export, job, job_path, companion=companion,
                                   background=self.config.publisher_priority == IDLE)
        except OSError as err:
            logger.warning("rank %d: fork failed (%s); exporting %s inline on the training thread instead",
                           self.rank, err.strerror or err, Path(job.trace_path).name)
            return None
        self._note_fork_time(time.monotonic() - started)
        return exporter

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

    # -- outcomes --------------------------------------------------------------------------

    def _count_failure(self, trace_path: str | None = None) -> None:
        self.stats["publish_failures"] += 1
        self.progress.add(trace_path or "", ok=False)

    def _record(self, publication: Publication, status: PublishStatus) -> None:
        """On the publications thread, once per trace: learn its size, count and log its outcome."""
        trace_path = publication.job.trace_path
        if status.raw_mb is not None:
            self.planner.learn(status.raw_mb * 1e6, publication.steps)
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
        seconds = time.monotonic() - publication.started
        self.progress.add(trace_path, ok=True, megabytes=trace_mb, seconds=seconds,
                          summary_failed=status.summary_error is not None)
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
        publications = self.publications
        if publications is not None and self.config.publisher_priority == IDLE:
            publications.leave_idle_policy()  # training is over: nothing to yield the CPU to
        current = deadline if callable(deadline) else (lambda: deadline)
        if self.in_flight and current() > time.monotonic():
            level = logging.INFO if self.rank == 0 else logging.DEBUG  # one line, not one per rank
            logger.log(level, "rank %d: waiting up to %.0f s for %d trace(s) to be published", self.rank,
                       current() - time.monotonic(), self.in_flight)
        while self.in_flight and (left := current() - time.monotonic()) > 0:
            futures.wait(self._outcomes, min(left, 0.1), return_when=futures.FIRST_COMPLETED)
        if publications is not None:
            if self.in_flight:
                logger.error("rank %d: %d trace(s) not published within %s; stopping them", self.rank,
                             self.in_flight, why)
                publications.stop_all(why)
            publications.close()
        self.staging.close()

    def abandon(self) -> None:
        """From a watchdog thread while the training thread is stuck: stop every process now and
        remove their files and the staging directories."""
        self.accepting = False
        if self.publications is not None:
            self.publications.stop_all("--torch-profile-term-grace")
            self.publications.close()
        self.staging.close()
