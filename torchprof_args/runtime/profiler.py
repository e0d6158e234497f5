"""``TorchProfiler``: torch.profiler driven by ``--torch-profile-*`` flags, safe for NCCL jobs.

Build it on every rank with :meth:`TorchProfiler.from_args` (or from a
:class:`~torchprof_args.runtime.config.ProfilerConfig`), enter it (``start()`` is a collective:
every rank must call it, after ``init_process_group`` if any) and call ``prof.step(iteration)``
once per optimizer step.  On ranks that are not traced, or without ``--torch-profile``, ``step``
is one integer comparison.

Every rank evaluates the same schedule (and adopts the same on-demand windows), so every rank
knows without communicating where a pause is: a flush, a memory snapshot, the exit.  There the
traced ranks hand their trace to :class:`~torchprof_args.runtime.export.writer.TraceWriter` and
every rank meets at the :class:`~torchprof_args.runtime.fence.Fence`, never inside a watchdogged
NCCL collective; SIGTERM is acted on at a safe point; any profiling error is logged with rank and
reason, and training goes on.  ARCHITECTURE.md follows a trace from ``step()`` to its file.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchprof_args import _dist
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.log import get_logger
from torchprof_args.ondemand.controller import OnDemandController
from torchprof_args.ondemand.dynolog import check_kineto_daemon_env
from torchprof_args.runtime.config import ProfilerConfig
from torchprof_args.runtime.execution_trace import ExecutionTrace
from torchprof_args.runtime.export.staging import StagingArea
from torchprof_args.runtime.export.writer import TraceWriter
from torchprof_args.runtime.fence import Fence
from torchprof_args.runtime.flight_recorder import FlightRecorder
from torchprof_args.runtime.hostmem import WindowMemoryGuard
from torchprof_args.runtime.memory import MemorySnapshotter
from torchprof_args.runtime.metadata import trace_metadata
from torchprof_args.runtime.nsys import NsysController
from torchprof_args.runtime.ranks import traced_ranks
from torchprof_args.runtime.recorder import RECORDING, Recorder
from torchprof_args.runtime.schedule import Action
from torchprof_args.runtime.signals import SigtermGuard
from torchprof_args.runtime.timeline import Timeline

if TYPE_CHECKING:
    from torchprof_args.config import RunConfig

__all__ = ["TorchProfiler"]

logger = get_logger(__name__)

#: Seconds of --torch-profile-term-grace kept for stopping publishers that did not finish.
_STOP_RESERVE = 4.5


class TorchProfiler:
    """A torch.profiler context manager driven by the schedule flags; see the module docstring.

    The constructor only stores the configs (no collective, no files); ``memory`` and ``nsys``
    replace the components :meth:`start` would build (stand-in CUDA functions where there is no GPU).
    """

    def __init__(self, config: ProfilerConfig, *, rank: int | None = None, world_size: int | None = None,
                 start_iteration: int = 0, memory: MemorySnapshotter | None = None,
                 nsys: NsysController | None = None) -> None:
        self.config = config
        self.rank = _dist.rank() if rank is None else rank
        self.world_size = _dist.world_size() if world_size is None else world_size
        self.enabled = config.enabled
        self.schedule = config.trace.schedule
        self.output_dir = config.trace.output_dir
        #: This rank records the schedule's windows (known for sure after :meth:`start`).
        self.record = config.trace.enabled and config.trace.selects(self.rank)
        self._timeline = Timeline(self.schedule, scheduled=config.follows_schedule, first_iteration=start_iteration + 1,
                                  rank=self.rank, record=self.record)
        self._iteration = start_iteration
        self._started = False
        #: end_window() ran: later steps do nothing, stop() only waits for publications.
        self._window_ended = False
        self._next_busy_step = math.inf
        self._next_check: float = math.inf
        self._last_flush_seconds = 0.0
        self._ranks = config.trace.ranks
        self._fence = Fence(config.export.flush_timeout, self.rank)
        self._sigterm = SigtermGuard(self.rank, config.export.term_grace)
        self._memory_guard = WindowMemoryGuard(config.export.min_free_host_mb << 20, self._fence)
        #: Every rank fences at multiples of this (agreed in start(): any rank that dumps snapshots).
        self._snapshot_interval = 0
        self._staging_problem: str | None = None
        #: Inside step()'s or stop()'s work: a SIGTERM is acted on at the end, not in the handler.
        self._critical = False
        self._flight_recorder = FlightRecorder.from_config(config.flight_recorder, self.rank)
        if self._flight_recorder is not None:  # hang forensics: dump when the fence fails (and on SIGTERM)
            self._fence.on_failure.append(self._flight_recorder.on_fence_failure)
        self._recorder = Recorder(config.trace, self._submit, rank=self.rank)
        self._memory_given, self._nsys_given = memory, nsys
        self._memory: MemorySnapshotter | None = None
        self._nsys: NsysController | None = None
        self._on_demand: OnDemandController | None = None
        self._writer: TraceWriter | None = None
        #: nsys opens an NVTX range for every step; memory snapshots need only flush steps and
        #: multiples of their interval (see _plan_next).
        self._every_step = False

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, start_iteration: int | None = None) -> TorchProfiler:
        """Build from parsed flags (checked here: raises :class:`~torchprof_args.TorchProfileArgsError`).

        ``start_iteration`` is the number of optimizer steps already done (resume from a
        checkpoint); defaults to ``args.iteration`` (Megatron-LM sets it), else 0.
        """
        from torchprof_args.config import configs_from_args

        return cls.from_config(configs_from_args(args, world_size=_dist.world_size()), start_iteration=start_iteration)

    @classmethod
    def from_config(cls, run: RunConfig, *, start_iteration: int | None = None) -> TorchProfiler:
        """Build from checked configs (see :func:`~torchprof_args.config.configs_from_args`)."""
        rank = _dist.rank()
        check_kineto_daemon_env(rank)
        start = run.start_iteration if start_iteration is None else start_iteration
        return cls(run.profiler, rank=rank, world_size=_dist.world_size(), start_iteration=start)

    # -- context manager --------------------------------------------------------------------

    def __enter__(self) -> TorchProfiler:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._flight_recorder is not None and exc_type is not None and not (  # e.g. a collective timed out
                isinstance(exc, SystemExit) and exc.code in (0, None)):  # not a clean sys.exit()
            self._flight_recorder.dump(f"{exc_type.__name__} left the profiler's context: {str(exc)[:200]}")
        if self._memory is not None and isinstance(exc, torch.OutOfMemoryError):
            self._memory.on_oom(self._iteration + 1)  # before the error unwinds any further
        self.stop(clean=exc_type is None)

    def start(self) -> None:
        """Begin following the schedule.  Collective: every rank calls it (``__enter__`` does).

        Resolves ``--torch-profile-parallel-ranks``, creates the fence's gloo group, prepares the
        on-demand control directory and this rank's private staging directories (raising
        :class:`~torchprof_args.TorchProfileArgsError` on every rank if any rank's is unsafe), and
        says once, before training, what cannot work here (memory snapshots or nsys without CUDA).
        """
        if not self.enabled or self._started:
            if self._flight_recorder is not None:
                self._flight_recorder.arm()
            return
        self._started = True
        self._window_ended = False
        try:
            self._build_components()
            self._agree_at_start()
        except BaseException:
            self._started = False
            if self._writer is not None:
                self._writer.close(0.0, "start-up")
            raise
        first = self._timeline.first_iteration
        self._sigterm.install(on_signal=self._sigterm_noted, emergency=self._sigterm_emergency)
        if self._flight_recorder is not None:  # on the guard's SIGTERM watchdog: dumps even while blocked
            self._flight_recorder.arm(self._sigterm)
        if self._memory is not None:
            self._memory.start()
        if self._nsys is not None:
            self._nsys.on_step(first, recording=self.schedule.action(first, first) in RECORDING)
        if self.record:
            logger.info("rank %d: profiling %s; traces go to %s", self.rank, self.schedule.describe(),
                        os.path.abspath(self.output_dir))
            self._start_recorder(first)
        if self._on_demand is not None:
            self._on_demand.open()
        self._next_busy_step = -math.inf  # the first step() call anchors the numbering

    def _build_components(self) -> None:
        trace, on_demand = self.config.trace, self.config.on_demand
        ranks = self._ranks = traced_ranks(trace) if self._timeline.scheduled else trace.ranks
        selected = ranks is None or self.rank in ranks
        self.record = self._timeline.record = trace.enabled and selected
        self._fence.open(self.world_size)
        memory = self._memory_given
        if memory is None and self.config.memory.enabled and selected:
            memory = MemorySnapshotter(self.config.memory, rank=self.rank)
        self._memory = memory if memory is not None and memory.usable() else None
        nsys = self._nsys_given or NsysController(enabled=self.config.nsys.enabled)
        self._nsys = nsys if nsys.enabled else None
        self._every_step = self._nsys is not None
        if on_demand.enabled:
            self._on_demand = OnDemandController(on_demand, rank=self.rank, world_size=self.world_size)
            self._on_demand.setup(self._fence.group)  # collective; raises on every rank if unsafe
            self._next_check = self._on_demand.start_checks(self._timeline.first_iteration - 1)
        if self.record or self._on_demand is not None:
            staging = StagingArea(self.config.export.staging_dir, rank=self.rank)
            try:
                staging.open()
                self._writer = TraceWriter(self.output_dir, staging, self.config.export, rank=self.rank)
                if trace.execution_trace:  # on disk: an execution trace can be as large as the trace
                    self._recorder.execution_trace = ExecutionTrace((staging.disk_dirs or staging.dirs)[0],
                                                                    rank=self.rank)
            except TorchProfileArgsError as err:
                staging.close()
                self._staging_problem = str(err)

    def _agree_at_start(self) -> None:
        """Collective: raise on every rank if any rank cannot stage; agree on the snapshot fence."""
        interval = self._memory.interval if self._memory is not None else 0
        answers = self._fence.agree((self._staging_problem, interval))
        problems = [f"rank {rank}: {problem}" for rank, (problem, _) in enumerate(answers) if problem]
        if problems:
            raise TorchProfileArgsError(" ".join(problems))
        self._snapshot_interval = max(every for _, every in answers)

    def stop(self, clean: bool = True) -> None:
        """Finish: flush a partly recorded window (``clean``), wait for pending publications
        (at most ``--torch-profile-exit-timeout``), then meet every rank at the fence.

        ``clean`` is False when leaving on an exception: ranks are then not in step, so there is
        no barrier and a partly recorded window is dropped.
        """
        if self._flight_recorder is not None:
            self._flight_recorder.disarm()
        if not self._started:
            return
        self._critical = True
        last, timeout = self._iteration, self.config.export.exit_timeout
        try:
            partial = clean and not self._sigterm.pending and self.window_open
            self._shut_down(keep_window=partial, deadline=time.monotonic() + timeout,
                            why=f"--torch-profile-exit-timeout ({timeout:g} s)")
            if clean and not self._sigterm.pending:
                self._fence.wait(last, "exit")
        finally:
            self._critical = False
        if self._sigterm.pending:
            self._sigterm.deliver()
        else:
            self._sigterm.restore()

    def _shut_down(self, *, keep_window: bool, deadline: float, why: str, dying: bool = False) -> None:
        """Stop every component; publishers get until ``deadline`` (sooner after a SIGTERM).
        ``dying``: the process ends right after, so torch.profiler, nsys and the allocator history
        are left as they are (this may run between any two bytecodes of the application)."""
        self._started = False
        self._next_busy_step = math.inf
        if not dying:
            self._memory_guard.abandon()
            self._recorder.stop(self._iteration, keep=keep_window)
            if self._nsys is not None:
                self._nsys.close()
            if self._memory is not None:
                self._memory.close()
        self._timeline.window = None
        if self._on_demand is not None:
            self._on_demand.close()
        if self._writer is not None:
            sigterm = self._sigterm
            reserve = min(_STOP_RESERVE, sigterm.grace / 2)
            why = f"--torch-profile-term-grace ({sigterm.grace:g} s)" if sigterm.pending else why
            self._writer.close(lambda: min(deadline, sigterm.deadline - reserve), why)

    @property
    def iteration(self) -> int:
        """The last iteration passed to :meth:`step` (the resume point before the first one)."""
        return self._iteration

    @property
    def window_open(self) -> bool:
        """A window (scheduled or on-demand) is recording at the last stepped iteration: ending now flushes it."""
        return (self._started and not self._window_ended
                and self._timeline.global_action(self._iteration) is Action.RECORD)

    def end_window(self) -> bool:
        """Stop recording for good; flush a window still recording (a clean early exit).

        Collective when :attr:`window_open` (the same on every rank): every rank calls it at the
        same iteration, as at a scheduled flush.  Returns whether a window was flushed; later
        :meth:`step` calls do nothing and :meth:`stop` only waits for publications.
        """
        if not self._started or self._window_ended:
            return False
        flush = self.window_open
        self._window_ended = True
        self._next_busy_step = self._next_check = math.inf
        started = time.perf_counter()
        self._critical = True
        try:
            self._recorder.stop(self._iteration, keep=flush)
            if flush:
                self._fence.wait(self._iteration, "flush")
                self._last_flush_seconds = time.perf_counter() - started
        finally:
            self._critical = False
        return flush

    # -- SIGTERM ----------------------------------------------------------------------------

    def _sigterm_noted(self) -> None:
        """Inside the signal handler.  Outside step()/stop() with the default action pending, this
        is a safe point already (nothing of torch is touched); else the next step() is."""
        self._next_busy_step = -math.inf
        if not self._critical and self._started and self._sigterm.default_action:
            self._on_sigterm(self._iteration, dying=True)

    def _on_sigterm(self, iteration: int, dying: bool = False) -> None:
        """The safe point after a SIGTERM: clean up within the grace, then deliver the signal."""
        sigterm = self._sigterm
        logger.warning("rank %d: SIGTERM received; stopping profiling after iteration %d (pending traces get until "
                       "--torch-profile-term-grace, %.0f s after the signal)", self.rank, iteration, sigterm.grace)
        sigterm.run_hooks()
        self._shut_down(keep_window=False, deadline=sigterm.deadline, why="--torch-profile-term-grace", dying=dying)
        sigterm.deliver()

    def _sigterm_emergency(self) -> None:
        """Watchdog thread, the main thread being stuck: stop processes, remove files; no torch calls."""
        if self._writer is not None:
            self._writer.abandon()

    # -- the hot path -----------------------------------------------------------------------

    def step(self, iteration: int | None = None) -> None:
        """Mark the end of optimizer step ``iteration`` (1-based global; default: previous + 1)."""
        if iteration is None:
            iteration = self._iteration + 1
        self._iteration = iteration
        if iteration < self._next_busy_step:
            return
        self._critical = True  # torch.profiler may change state: a SIGTERM waits for the end
        try:
            self._busy_step(iteration)
        finally:
            self._critical = False

    def _busy_step(self, iteration: int) -> None:
        if self._sigterm.pending:
            self._on_sigterm(iteration)
            return
        timeline = self._timeline
        if not timeline.anchored:
            timeline.anchor(iteration)
        if iteration >= self._next_check:
            self._check_on_demand(iteration)
        if self._memory_guard.enabled:
            self._memory_guard.check(iteration, timeline, rank=self.rank)
        current = timeline.global_action(iteration)
        upcoming = timeline.local_action(iteration + 1)
        started = time.perf_counter()
        recorder = self._recorder
        if not recorder.active and upcoming is not Action.NONE and not recorder.broken:
            self._start_recorder(iteration + 1)  # first on-demand window on this rank
        elif recorder.step(iteration, timeline.local_action(iteration), upcoming):
            recorder.add_metadata(self._metadata(iteration + 1))
        pause = self._snapshot(iteration, current)  # before the barrier, so a slow dump is fenced too
        if current is Action.RECORD_AND_SAVE:
            pause = "flush"
        if pause and not self._sigterm.pending:
            self._fence.wait(iteration, pause)
            self._last_flush_seconds = time.perf_counter() - started
        if self._nsys is not None:
            self._nsys.on_step(iteration + 1, recording=timeline.scheduled_action(iteration + 1) in RECORDING)
        if timeline.window is not None and iteration >= timeline.window.end - 1:
            timeline.window = None
        self._plan_next(iteration)
        if self._sigterm.pending:  # the end of the flush is a safe point too
            self._on_sigterm(iteration)

    def _snapshot(self, iteration: int, current: Action) -> str | None:
        """Memory snapshots due after ``iteration``; the reason to fence when an interval dump is due
        (every rank agrees: see start)."""
        if self._memory is not None:
            scheduled = self._timeline.scheduled_action(iteration) is not Action.NONE
            self._memory.on_step(iteration, profiled_cycle_ended=current is Action.RECORD_AND_SAVE and scheduled)
        every = self._snapshot_interval
        return "memory snapshot" if every > 0 and iteration > 0 and iteration % every == 0 else None

    def _plan_next(self, iteration: int) -> None:
        """Set the next iteration whose ``step`` has work (a transition, a flush, a check, a snapshot)."""
        candidates = [self._next_check]
        if self._snapshot_interval > 0:
            candidates.append((iteration // self._snapshot_interval + 1) * self._snapshot_interval)
        busy = iteration + 1 if self._every_step else self._timeline.next_busy(iteration, candidates)
        self._next_busy_step = busy
        if self._sigterm.pending:  # a handler that ran before the assignment above is not lost
            self._next_busy_step = -math.inf

    # -- what each iteration does -----------------------------------------------------------

    def _check_on_demand(self, iteration: int) -> None:
        """Collective at a check iteration: adopt the window every rank received, plan the next check."""
        window = self._on_demand.poll(iteration, self._fence.group,
                                      busy=lambda i: self._timeline.scheduled_action(i) is not Action.NONE)
        if window is not None:
            self._timeline.window = window
            if window.traces(self.rank):
                logger.info("rank %d: on-demand request %s: tracing iterations %d..%d", self.rank,
                            window.request_id, window.start, window.end - 1)
        self._next_check = self._on_demand.next_check

    # -- traces -----------------------------------------------------------------------------

    def _start_recorder(self, first: int) -> None:
        if self._recorder.start(first, self._timeline.local_action(first)):
            self._recorder.add_metadata(self._metadata(first))

    def _metadata(self, first: int) -> dict[str, Any]:
        return trace_metadata(self.config.trace, self._timeline, first, traced_ranks=self._ranks, rank=self.rank,
                              world_size=self.world_size)

    def _submit(self, export: Any, first: int, last: int, execution_trace: Path | None = None) -> None:
        if self._writer is not None:
            self._writer.submit_window(export, first, last, execution_trace)
        elif execution_trace is not None:
            execution_trace.unlink(missing_ok=True)

    # -- figures ----------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, float]:
        """This rank's profiler figures: last flush stall, fence waits, last trace size, counts."""
        figures = {"flush_seconds": self._last_flush_seconds, "fence_waits": self._fence.waits}
        if self._writer is not None:
            figures.update(self._writer.stats)
        return figures

    @property
    def published_traces(self) -> list[str]:
        """Paths of the traces this rank has published so far."""
        return list(self._writer.published) if self._writer is not None else []
