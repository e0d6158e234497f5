"""``TorchProfiler``: torch.profiler driven by ``--torch-profile-*`` flags, safe for NCCL jobs.

Build it on every rank with :meth:`TorchProfiler.from_args` (or from a
:class:`~torchprof_args.capture.runtime.config.ProfilerConfig`), enter it (``start()`` is a collective:
every rank must call it, after ``init_process_group`` if any) and call ``prof.step(iteration)``
once per optimizer step.  On ranks that are not traced, or without ``--torch-profile``, ``step``
is one integer comparison.

Every rank evaluates the same schedule (and adopts the same on-demand windows), so every rank
knows without communicating where a pause is: a flush, a memory snapshot, the exit.  There the
traced ranks hand their trace to :class:`~torchprof_args.capture.runtime.export.writer.TraceWriter` and
every rank meets at the :class:`~torchprof_args.capture.runtime.fence.Fence`, never inside a watchdogged
NCCL collective; SIGTERM is acted on at a safe point; any profiling error is logged with rank and
reason, and training goes on.  ARCHITECTURE.md follows a trace from ``step()`` to its file.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchprof_args import _dist
from torchprof_args.capture.ondemand.dynolog import check_kineto_daemon_env
from torchprof_args.capture.runtime.agreements import StepAgreements
from torchprof_args.capture.runtime.companions.expert_tokens import ExpertTokenCounter
from torchprof_args.capture.runtime.config import ProfiledRun, ProfilerConfig
from torchprof_args.capture.runtime.cost import ProfilingCost
from torchprof_args.capture.runtime.debug_server.server import DebugServer
from torchprof_args.capture.runtime.export.writer import TraceWriter
from torchprof_args.capture.runtime.fence import Fence
from torchprof_args.capture.runtime.flight_recorder import FlightRecorder
from torchprof_args.capture.runtime.host_resources import WindowMemoryGuard
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter
from torchprof_args.capture.runtime.metadata import trace_metadata
from torchprof_args.capture.runtime.nsys import NsysController
from torchprof_args.capture.runtime.publish_vote import PublishingVote, progress_row
from torchprof_args.capture.runtime.recorder import Recorder
from torchprof_args.capture.runtime.schedule import RECORDING, Action
from torchprof_args.capture.runtime.signals import SigtermGuard
from torchprof_args.capture.runtime.startup import set_up_rank
from torchprof_args.capture.runtime.timeline import StepPlan, Timeline
from torchprof_args.log import get_logger

__all__ = ["TorchProfiler"]

logger = get_logger(__name__)

#: Seconds of --torch-profile-term-grace kept for stopping publishers that did not finish.
_STOP_RESERVE = 4.5
#: At the end of --torch-profile-term-grace, a flight-recorder dump still being written gets this
#: much longer (torchrun sends SIGKILL 30 s after its SIGTERM).
_DUMP_FINISH_WAIT = 30.0


class TorchProfiler:
    """A torch.profiler context manager driven by the schedule flags; see the module docstring.

    Args:
        config: what to profile; ``rank``, ``world_size``: default: the process group's;
            ``start_iteration``: steps already done; ``memory``, ``nsys``: replace the components
            :meth:`start` would build (stand-in CUDA functions where there is no GPU).  The constructor
            only stores them (no collective, no files): :meth:`from_args` is the usual way in.
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
        self._timeline = Timeline(self.schedule, scheduled=config.follows_schedule,
                                  first_iteration=start_iteration + 1, rank=self.rank,
                                  record=config.trace.enabled and config.trace.selects(self.rank))
        self._iteration = start_iteration
        self._started = False
        #: end_window() ran: later steps do nothing, stop() only waits for publications.
        self._window_ended = False
        #: The hot path's one comparison: steps before it have nothing to do (see StepPlan.next_busy),
        #: or only the cost clock's timestamp while a publisher runs (before ``_planned_busy``).
        self._next_busy_step = self._planned_busy = math.inf
        self._cost = ProfilingCost()
        self._ranks = config.trace.ranks
        self._fence = Fence(config.export.flush_timeout, self.rank)
        self._sigterm = SigtermGuard(self.rank, config.export.term_grace)
        self._memory_guard = WindowMemoryGuard(config.export.min_free_host_mb << 20, self._fence)
        self._publishing = PublishingVote(config.export.max_publishing, self._fence, rank=self.rank)
        self._timeline.vote_ahead = True
        self._agreements = StepAgreements(self._timeline, self._fence, self._memory_guard, self._publishing,
                                          self.rank)
        #: Inside step()'s or stop()'s work: a SIGTERM is acted on at the end, not in the handler.
        self._critical = False
        self._flight_recorder = FlightRecorder.from_config(config.flight_recorder, self.rank,
                                                           profiling=self.enabled)  # + the stacks server
        if self._flight_recorder is not None:  # hang forensics: dump when the fence fails (and on SIGTERM)
            self._fence.on_failure.append(self._flight_recorder.on_fence_failure)
        #: PyTorch's debug server (--torch-profile-debug-server), from start() to the end of stop().
        self._debug_server = DebugServer.from_config(config.debug_server, self.rank)
        self._recorder = Recorder(config.trace, rank=self.rank)
        #: what the job adds to each trace's ``torchprof_args`` metadata (:meth:`add_trace_metadata`).
        self.extra_metadata: dict[str, Any] = {}
        self._memory_given, self._nsys_given = memory, nsys
        self._memory: MemorySnapshotter | None = None
        self._nsys: NsysController | None = None
        self._writer: TraceWriter | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, start_iteration: int | None = None) -> TorchProfiler:
        """A profiler, not started, from parsed flags (checked here: raises
        :class:`~torchprof_args.TorchProfileArgsError`).

        Args:
            args: the namespace; ``start_iteration``: optimizer steps already done (a resumed run),
                default ``args.iteration`` (Megatron-LM sets it), else 0.
        """
        from torchprof_args.capture.config import configs_from_args

        run = configs_from_args(args, world_size=_dist.world_size())
        return cls.from_config(run, start_iteration=start_iteration)

    @classmethod
    def from_config(cls, run: ProfiledRun, *, start_iteration: int | None = None) -> TorchProfiler:
        """A profiler, not started, from checked configs (:func:`~.config.configs_from_args`).

        Args:
            run: the run's configs; ``start_iteration``: overrides ``run.start_iteration``.
        """
        rank = _dist.rank()
        check_kineto_daemon_env(rank)
        start = run.start_iteration if start_iteration is None else start_iteration
        return cls(run.profiler, rank=rank, world_size=_dist.world_size(), start_iteration=start)

    def __enter__(self) -> TorchProfiler:
        """Start (:meth:`start`, a collective) and return the profiler."""
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Stop: cleanly without an exception; on one, the flight recorder dumps first, and on an
        out-of-memory error the memory snapshotter too.
        """
        clean_exit = isinstance(exc, SystemExit) and exc.code in (0, None)
        if self._flight_recorder is not None and exc_type is not None and not clean_exit:
            # e.g. a collective timed out: the launcher's SIGTERM (once the first rank exits) waits
            # for the end of stop() (critical), or it would end the process with this dump half written
            reason = f"{exc_type.__name__} left the profiler's context: {str(exc)[:200]}"
            critical, self._critical = self._critical, True
            try:
                self._flight_recorder.dump(reason, exc=exc)
            finally:
                self._critical = critical
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
        if self._debug_server is not None:  # before any signal handling of ours: its frontend is forked
            self._debug_server.start()
        if not self.enabled or self._started:
            if self._flight_recorder is not None:
                self._flight_recorder.arm()
            return
        self._started = True
        self._window_ended = False
        try:
            setup = set_up_rank(self.config, self._timeline, self._fence, world_size=self.world_size,
                                memory=self._memory_given, nsys=self._nsys_given)
        except BaseException:
            self._started = False
            raise
        self._ranks, self._memory, self._nsys = setup.traced_ranks, setup.memory, setup.nsys
        self._writer, self._agreements.on_demand = setup.writer, setup.on_demand
        self._recorder.writer, self._recorder.execution_trace = setup.writer, setup.execution_trace
        first = self._timeline.first_iteration
        self._sigterm.install(on_signal=self._sigterm_noted, emergency=self._sigterm_emergency)
        if self._flight_recorder is not None:  # on the SIGTERM watchdog: dumps even while blocked
            self._flight_recorder.arm(self._sigterm)
        if self._memory is not None:
            self._memory.start()
        if self._nsys is not None:
            self._nsys.on_step(first, recording=self.schedule.action(first, first) in RECORDING)
        if self.record:
            logger.info("rank %d: profiling %s; traces go to %s", self.rank, self.schedule.describe(),
                        os.path.abspath(self.output_dir))
            if self._recorder.start(first, self._timeline.local_action(first)):
                self._recorder.add_metadata(self._metadata(first))
        if self._agreements.on_demand is not None:
            self._agreements.on_demand.open()
        self._next_busy_step = self._planned_busy = -math.inf  # the first step() call anchors the numbering

    def stop(self, clean: bool = True) -> None:
        """Finish: flush a partly recorded window, wait for pending publications (at most
        ``--torch-profile-exit-timeout``), then meet every rank at the fence.

        Args:
            clean: False when leaving on an exception: ranks are then not in step, so there is no
                barrier and a partly recorded window is dropped.
        """
        if self._flight_recorder is not None:
            self._flight_recorder.disarm()
        if not self._started:
            if self._debug_server is not None:
                self._debug_server.stop()
            return
        self._critical = True
        last, timeout = self._iteration, self.config.export.exit_timeout
        try:
            partial = clean and not self._sigterm.pending and self.window_open
            self._shut_down(keep_window=partial, deadline=time.monotonic() + timeout,
                            why=f"--torch-profile-exit-timeout ({timeout:g} s)")
            if clean and not self._sigterm.pending and self._fence.wait(last, "exit"):
                self._publishing.final(progress_row(self._writer))  # rank 0's last line
        finally:
            self._critical = False
        if self._debug_server is not None:  # last: it shows the ranks while they publish and fence
            self._debug_server.stop()
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
            self._publishing.abandon()
            self._recorder.stop(self._iteration, keep=keep_window)
            if self._nsys is not None:
                self._nsys.close()
            if self._memory is not None:
                self._memory.close()
        self._timeline.window = None
        if self._agreements.on_demand is not None:
            self._agreements.on_demand.close()
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
    def record(self) -> bool:
        """This rank records the schedule's windows (known for sure after :meth:`start`)."""
        return self._timeline.record

    @property
    def window_open(self) -> bool:
        """A window (scheduled or on-demand) records at the last stepped iteration: ending now
        flushes it."""
        return (self._started and not self._window_ended
                and self._timeline.global_action(self._iteration) is Action.RECORD)

    def end_window(self) -> bool:
        """Stop recording for good; flush a window still recording (a clean early exit).

        Collective when :attr:`window_open` (the same on every rank): every rank calls it at the same
        iteration, as at a scheduled flush.  Later :meth:`step` calls do nothing and :meth:`stop` only
        waits for publications.  Returns whether a window was flushed.
        """
        if not self._started or self._window_ended:
            return False
        flush = self.window_open
        self._window_ended = True
        self._next_busy_step = self._planned_busy = self._timeline.next_check = math.inf
        started = time.perf_counter()
        self._critical = True
        try:
            self._recorder.stop(self._iteration, keep=flush)
            if flush:
                self._fence.wait(self._iteration, "flush")
                self._cost.stall("flush", time.perf_counter() - started)
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
        logger.warning("rank %d: SIGTERM received; stopping profiling after iteration %d (pending traces "
                       "get until --torch-profile-term-grace, %.0f s after the signal)", self.rank, iteration,
                       sigterm.grace)
        sigterm.run_hooks()
        self._shut_down(keep_window=False, deadline=sigterm.deadline, why="--torch-profile-term-grace",
                        dying=dying)
        sigterm.deliver()

    def _sigterm_emergency(self) -> None:
        """Watchdog thread, the main thread stuck: stop processes, remove files; no torch calls.  A flight-
        recorder dump in progress is finished first: it is what the hang leaves (SIGKILL bounds the wait)."""
        if self._flight_recorder is not None:
            self._flight_recorder.wait_for_dump(_DUMP_FINISH_WAIT)
        if self._writer is not None:
            self._writer.abandon()

    # -- the hot path -----------------------------------------------------------------------

    def step(self, iteration: int | None = None) -> None:
        """Mark the end of an optimizer step: one integer comparison unless the step is busy (planned ahead,
        the same on every rank).

        Args:
            iteration: the 1-based global step just finished (default: the previous one + 1).
        """
        if iteration is None:
            iteration = self._iteration + 1
        self._iteration = iteration
        if iteration < self._next_busy_step:
            return
        self._critical = True  # torch.profiler may change state: a SIGTERM waits for the end
        try:
            self._cost.arrive(iteration)
            if iteration >= self._planned_busy or self._sigterm.pending:  # else only the cost clock's
                self._busy_step(iteration)
            recording = self._timeline.local_action(iteration + 1) is not Action.NONE
            if self._started and self._cost.resume(iteration, recording, self._writer):
                self._next_busy_step = min(self._next_busy_step, iteration + 1)  # a publisher runs
        finally:
            self._critical = False

    def _busy_step(self, iteration: int) -> None:
        """A planned busy step: this step's agreements first (collective, at iterations every rank
        knows: :mod:`.agreements`), then the timeline's plan for it."""
        if self._sigterm.pending:
            self._on_sigterm(iteration)
            return
        timeline = self._timeline
        if not timeline.anchored:
            timeline.anchor(iteration)
        self._agreements.take(iteration)
        self._execute(timeline.plan(iteration))
        self._publishing.post(iteration, timeline, lambda: progress_row(self._writer))
        if self._sigterm.pending:  # the end of the flush is a safe point too
            self._on_sigterm(iteration)

    def _execute(self, plan: StepPlan) -> None:
        """Do what ``plan`` says: the recorder's transition (a flush inside), memory snapshots,
        the fence (after the snapshot, so a slow dump is fenced too), nsys, the next busy step."""
        iteration = plan.iteration
        started = time.perf_counter()
        if self._recorder.step(iteration, plan.record, plan.record_next):
            self._recorder.add_metadata(self._metadata(iteration + 1))
        if self._memory is not None:
            self._memory.on_step(iteration, profiled_cycle_ended=plan.cycle_snapshot)
        if plan.fence and not self._sigterm.pending:
            self._fence.wait(iteration, plan.fence)
            self._cost.stall(plan.fence, time.perf_counter() - started)
        if self._nsys is not None:
            self._nsys.on_step(iteration + 1, recording=plan.nsys_recording)
        if plan.window_ends:
            self._timeline.window = None
        self._next_busy_step = self._planned_busy = plan.next_busy
        if self._sigterm.pending:  # a handler that ran before the assignment above is not lost
            self._next_busy_step = -math.inf

    def _metadata(self, first: int) -> dict[str, Any]:
        return {**trace_metadata(self.config.trace, self._timeline, first, traced_ranks=self._ranks,
                                 rank=self.rank, world_size=self.world_size), **self.extra_metadata}

    def add_trace_metadata(self, **values: Any) -> None:
        """Keep JSON ``values`` in the ``torchprof_args`` metadata of every trace whose window opens from
        now on, e.g. ``pipeline=pipeline_metadata(stages, micro_batches)`` for ``torchprof diagnose``.
        """
        self.extra_metadata.update(values)

    def watch_experts(self, model: nn.Module, *, ep_ranks: Sequence[int] | None = None) -> int:
        """Record, in each window this rank traces, the routed tokens per expert of ``model``'s MoE
        layers (torchtitan's: modules with a ``tokens_per_expert_E`` buffer), per layer and recorded
        step, published with the trace in the cycle folder's ``expert_tokens/`` for ``torchprof
        diagnose``'s ``expert_imbalance``
        (:mod:`~torchprof_args.capture.runtime.companions.expert_tokens`: no collective, one copy to
        the host per window).  Call it once per model (part), best before the profiler starts (a
        window already recording is counted from here on); returns the MoE layers found.

        Args:
            model: the model, or one pipeline stage of it.
            ep_ranks: the global ranks of this rank's expert-parallel group in its order (expert ``e``
                lives on ``ep_ranks[e // experts_per_rank]``); None: not known (no expert parallelism).
        """
        counter = self._recorder.expert_tokens or ExpertTokenCounter(rank=self.rank)
        found = counter.watch(model, list(ep_ranks) if ep_ranks is not None else None)
        self._recorder.expert_tokens = counter
        if self._recorder.in_window and not counter.active:
            counter.start()
        return found

    @property
    def stats(self) -> dict[str, float]:
        """This rank's figures: last stall, fence waits, last trace, counts, costs so far (cost.py)."""
        figures = {"flush_seconds": self._cost.last_stall, "fence_waits": self._fence.waits,
                   "windows_skipped": self._publishing.skipped, **self._cost.figures()}
        if self._writer is not None:
            figures.update(self._writer.stats)
        return figures

    @property
    def published_traces(self) -> list[str]:
        """Paths of the traces this rank has published so far."""
        return list(self._writer.published) if self._writer is not None else []
