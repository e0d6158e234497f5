"""``TorchProfiler``: torch.profiler driven by ``--torch-profile-*`` flags, safe for NCCL jobs.

Build it on every rank with :meth:`TorchProfiler.from_args` (or from a
:class:`~torchprof_args.runtime.config.ProfilerConfig`), enter it (``start()`` is a collective:
every rank must call it, after ``init_process_group`` if any) and call ``prof.step(iteration)``
once per optimizer step.  On ranks that are not traced, or without ``--torch-profile``, ``step``
is one integer comparison.

The flush protocol (why a 512-rank job survives a multi-minute trace export):

1. every rank evaluates the same :class:`~torchprof_args.runtime.schedule.ProfileSchedule`, so
   every rank knows the flush iterations without communicating;
2. at a flush iteration the traced ranks stop the profiler and hand the trace to
   :class:`~torchprof_args.runtime.export.writer.TraceWriter` (serialised to node-local staging
   by a forked child); then all ranks meet at the :class:`~torchprof_args.runtime.fence.Fence`
   (device synchronised, gloo barrier with a long timeout), so nobody waits inside a watchdogged
   NCCL collective;
3. compression and the move into the output directory run in a publisher process and publish
   atomically;
4. leaving the context (normally, on an exception, on SIGTERM) waits a bounded time for pending
   publications;
5. any profiling error is logged with rank and reason, and training goes on.

With ``--torch-profile-on-demand`` an :class:`~torchprof_args.ondemand.controller.OnDemandController`
adds a second source of windows: at its check iterations all ranks agree on a window requested
by ``torchprof trigger``; its actions come after the schedule's, the profiler is created lazily
on the ranks the request names, and its flush goes through the same fence.
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
from torchprof_args.log import get_logger
from torchprof_args.naming import EXECUTION_TRACE_SUFFIX, short_hostname, trace_stem
from torchprof_args.ondemand.controller import OnDemandController
from torchprof_args.ondemand.dynolog import check_kineto_daemon_env
from torchprof_args.ondemand.window import OnDemandWindow
from torchprof_args.runtime.config import ProfilerConfig
from torchprof_args.runtime.execution_trace import ExecutionTrace
from torchprof_args.runtime.export.staging import choose_staging_dir
from torchprof_args.runtime.export.writer import TraceWriter
from torchprof_args.runtime.fence import Fence
from torchprof_args.runtime.flight_recorder import FlightRecorder
from torchprof_args.runtime.memory import MemorySnapshotter
from torchprof_args.runtime.nsys import NsysController
from torchprof_args.runtime.ranks import traced_ranks
from torchprof_args.runtime.recorder import RECORDING, Recorder
from torchprof_args.runtime.schedule import Action
from torchprof_args.runtime.signals import SigtermGuard

if TYPE_CHECKING:
    from torchprof_args.config import RunConfig

__all__ = ["TorchProfiler"]

logger = get_logger(__name__)


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
        self._scheduled = config.follows_schedule
        self._first_iteration = start_iteration + 1
        self._iteration = start_iteration
        self._anchored = False
        self._started = False
        self._window_ended = False
        self._next_busy_step = math.inf
        self._next_check: float = math.inf
        self._last_flush_seconds = 0.0
        self._window: OnDemandWindow | None = None
        self._ranks = config.trace.ranks
        self._fence = Fence(config.export.flush_timeout, self.rank)
        self._sigterm = SigtermGuard(self.rank)
        self._flight_recorder = FlightRecorder.from_config(config.flight_recorder, self.rank)
        if self._flight_recorder is not None:  # hang forensics: dump when the fence fails or on SIGTERM
            self._fence.on_failure = self._flight_recorder.dump
            self._sigterm.on_signal = lambda: self._flight_recorder.dump("SIGTERM received")
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
        on-demand control directory (raising on every rank if it is unsafe), and says once, before
        training, what cannot work here (memory snapshots or nsys without CUDA).
        """
        if not self.enabled or self._started:
            if self._flight_recorder is not None:
                self._flight_recorder.arm()
            return
        self._started = True
        self._window_ended = False
        self._build_components()
        first = self._first_iteration
        self._sigterm.install()
        if self._flight_recorder is not None:  # after the guard, which must not wrap the recorder's handler
            self._flight_recorder.arm()
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
        ranks = self._ranks = traced_ranks(trace) if self._scheduled else trace.ranks
        selected = ranks is None or self.rank in ranks
        self.record = trace.enabled and selected
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
            self._next_check = self._on_demand.start_checks(self._first_iteration - 1)
        if self.record or self._on_demand is not None:
            staging = choose_staging_dir(self.config.export.staging_dir)
            self._writer = TraceWriter(self.output_dir, staging, self.config.export, rank=self.rank)
            if self.config.trace.execution_trace:
                self._recorder.execution_trace = ExecutionTrace(staging, rank=self.rank)

    def stop(self, clean: bool = True) -> None:
        """Finish: flush a partly recorded window (``clean``), wait for pending publications.

        ``clean`` is False when leaving on an exception: ranks are then not in step, so there is
        no barrier and a partly recorded window is dropped.
        """
        if self._flight_recorder is not None:
            self._flight_recorder.disarm()
        if not self._started:
            return
        if clean:
            self.end_window()
        else:
            self._recorder.stop(self._iteration, keep=False)
        self._started = False
        if self._nsys is not None:
            self._nsys.close()
        if self._memory is not None:
            self._memory.close()
        self._window = None
        if self._on_demand is not None:
            self._on_demand.close()
        if self._writer is not None:
            self._writer.close(self.config.export.exit_timeout)
        self._sigterm.restore()

    @property
    def iteration(self) -> int:
        """The last iteration passed to :meth:`step` (the resume point before the first one)."""
        return self._iteration

    @property
    def window_open(self) -> bool:
        """A window (scheduled or on-demand) is recording at the last stepped iteration: ending now flushes it."""
        return self._started and not self._window_ended and self._global_action(self._iteration) is Action.RECORD

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
        self._next_busy_step = math.inf
        self._next_check = math.inf
        started = time.perf_counter()
        self._recorder.stop(self._iteration, keep=flush)
        if flush:
            self._fence.wait(self._iteration)
            self._last_flush_seconds = time.perf_counter() - started
        return flush

    # -- the hot path -----------------------------------------------------------------------

    def step(self, iteration: int | None = None) -> None:
        """Mark the end of optimizer step ``iteration`` (1-based global; default: previous + 1)."""
        if iteration is None:
            iteration = self._iteration + 1
        self._iteration = iteration
        if iteration < self._next_busy_step:
            return
        self._busy_step(iteration)

    def _busy_step(self, iteration: int) -> None:
        if not self._anchored:
            self._anchor(iteration)
        if iteration >= self._next_check:
            self._check_on_demand(iteration)
        current = self._global_action(iteration)
        upcoming = self._local_action(iteration + 1)
        started = time.perf_counter()
        recorder = self._recorder
        if not recorder.active and upcoming is not Action.NONE and not recorder.broken:
            self._start_recorder(iteration + 1)  # first on-demand window on this rank
        elif recorder.step(iteration, self._local_action(iteration), upcoming):
            recorder.add_metadata(self._trace_metadata(iteration + 1))
        if self._memory is not None:  # before the barrier, so a slow dump is fenced too
            scheduled_flush = self._scheduled_action(iteration) is Action.RECORD_AND_SAVE
            self._memory.on_step(iteration, profiled_cycle_ended=scheduled_flush)
        if current is Action.RECORD_AND_SAVE:
            self._fence.wait(iteration)
            self._last_flush_seconds = time.perf_counter() - started
        if self._nsys is not None:
            self._nsys.on_step(iteration + 1, recording=self._scheduled_action(iteration + 1) in RECORDING)
        if self._window is not None and iteration >= self._window.end - 1:
            self._window = None
        self._plan_next(iteration)

    def _plan_next(self, iteration: int) -> None:
        """Set the next iteration whose ``step`` has work (a transition, a flush or a check)."""
        if self._every_step or self._global_action(iteration + 1) is not Action.NONE:
            self._next_busy_step = iteration + 1
            return
        candidates = [self._next_check]
        if self._memory is not None and self._memory.interval > 0:
            candidates.append((iteration // self._memory.interval + 1) * self._memory.interval)
        if self._scheduled:
            busy = self.schedule.next_busy_iteration(iteration + 1, self._first_iteration)
            if busy is not None:
                candidates.append(busy - 1)
        if self._window is not None:
            candidates.append(self._window.warmup_start - 1)
        self._next_busy_step = min(candidates)

    # -- what each iteration does -----------------------------------------------------------

    def _scheduled_action(self, iteration: int) -> Action:
        if not self._scheduled:
            return Action.NONE
        return self.schedule.action(iteration, self._first_iteration)

    def _global_action(self, iteration: int) -> Action:
        """The action every rank agrees on (fenced flushes): the schedule's, else the on-demand window's."""
        action = self._scheduled_action(iteration)
        if action is Action.NONE and self._window is not None:
            action = self._window.action(iteration)
        return action

    def _local_action(self, iteration: int) -> Action:
        """What this rank's torch.profiler does: only for the ranks the schedule or request names."""
        action = self._scheduled_action(iteration) if self.record else Action.NONE
        if action is Action.NONE and self._window is not None and self._window.traces(self.rank):
            action = self._window.action(iteration)
        return action

    def _check_on_demand(self, iteration: int) -> None:
        """Collective at a check iteration: adopt the window every rank received, plan the next check."""
        window = self._on_demand.poll(iteration, self._fence.group,
                                      busy=lambda i: self._scheduled_action(i) is not Action.NONE)
        if window is not None:
            self._window = window
            if window.traces(self.rank):
                logger.info("rank %d: on-demand request %s: tracing iterations %d..%d", self.rank,
                            window.request_id, window.start, window.end - 1)
        self._next_check = self._on_demand.next_check

    def _anchor(self, iteration: int) -> None:
        """Align the schedule with the caller's numbering at the first ``step`` call.

        A relative schedule counts steps of this run, so it follows the caller's first number.
        An absolute window that began before this run's first step cannot be recorded.
        """
        self._anchored = True
        if iteration == self._first_iteration:
            return
        if not self.schedule.absolute:
            self._first_iteration = iteration
        elif self.schedule.step_start <= iteration < self.schedule.step_end:
            logger.warning("rank %d: the run started at iteration %d, inside --torch-profile-step-start/-end; "
                           "pass start_iteration to TorchProfiler.from_args (or set args.iteration) so the window "
                           "is not missed", self.rank, iteration)

    # -- traces -----------------------------------------------------------------------------

    def _start_recorder(self, first: int) -> None:
        if self._recorder.start(first, self._local_action(first)):
            self._recorder.add_metadata(self._trace_metadata(first))

    def _submit(self, export: Any, first: int, last: int, execution_trace: Path | None = None) -> None:
        companions = [(str(execution_trace), EXECUTION_TRACE_SUFFIX)] if execution_trace is not None else []
        if self._writer is not None:
            self._writer.submit(export, trace_stem(self.rank, first, last), companions)
        elif execution_trace is not None:
            execution_trace.unlink(missing_ok=True)

    def _trace_metadata(self, first: int) -> dict[str, Any]:
        """The run's settings, stored in the trace of the window that starts at ``first``."""
        last = first
        while self._global_action(last) is Action.RECORD:
            last += 1
        trace = self.config.trace
        metadata = {
            "schedule": self.schedule.describe() if self._scheduled else "on demand only",
            "ranks": (["all"] if self._ranks is None else list(self._ranks)) if trace.enabled else [],
            "activities": list(trace.activities) or "auto",
            **trace.profiler_options(), "execution_trace": trace.execution_trace,
            "rank": self.rank, "world_size": self.world_size, "host": short_hostname(), "iterations": [first, last],
        }
        if self._window is not None and self._window.start <= first < self._window.end:
            metadata["on_demand_request"] = self._window.request_id
        return metadata

    # -- figures ----------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, float]:
        """This rank's profiler figures: last flush stall, last trace size, counts."""
        figures = {"flush_seconds": self._last_flush_seconds}
        if self._writer is not None:
            figures.update(self._writer.stats)
        return figures

    @property
    def published_traces(self) -> list[str]:
        """Paths of the traces this rank has published so far."""
        return list(self._writer.published) if self._writer is not None else []
