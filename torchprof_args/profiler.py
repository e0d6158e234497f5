"""``TorchProfiler``: torch.profiler driven by ``--torch-profile-*`` flags, safe for NCCL jobs.

Construct it on every rank with :meth:`TorchProfiler.from_args` and call ``prof.step(iteration)``
once per optimizer step.  On ranks that are not traced, or without ``--torch-profile``, ``step``
is a couple of integer comparisons.

The flush protocol (why a 512-rank job survives a multi-minute trace export):

1. every rank evaluates the same :class:`~torchprof_args.schedule.ProfileSchedule`, so every rank
   knows the flush iterations without communicating;
2. at a flush iteration the traced ranks stop the profiler and hand the trace to
   :class:`~torchprof_args.trace_writer.TraceWriter` (serialised to node-local staging by a forked
   child); then all ranks synchronise the device and meet at a barrier on a dedicated gloo group
   created up front with a long timeout, so nobody waits inside a watchdogged NCCL collective;
3. compression and the move into the output directory run in a publisher process and publish
   atomically;
4. leaving the context (normally, on an exception, on SIGTERM) waits a bounded time for pending
   publications;
5. any profiling error is logged with rank and reason, and training goes on.

With ``--torch-profile-on-demand`` an :class:`~torchprof_args.ondemand.OnDemandController` adds a
second source of windows: at its check iterations all ranks agree (one broadcast) on a window
requested by ``torchprof trigger``; its actions come after the schedule's, the profiler is created
lazily on the ranks the request names, and its flush is fenced by the same barrier.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import signal
import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

from torchprof_args.flags import any_profiling_feature, resolve_profile_dir, validate_args
from torchprof_args.log import get_logger
from torchprof_args.memory import MemorySnapshotter
from torchprof_args.nsys import NsysController
from torchprof_args.ondemand import OnDemandController, OnDemandWindow, check_kineto_daemon_env
from torchprof_args.schedule import Action, ProfileSchedule
from torchprof_args.trace_writer import TraceWriter, choose_staging_dir, short_hostname, trace_stem

logger = get_logger(__name__)

_RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)

# Clearing events between cycles is exactly what we want: one trace per cycle.
warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")


def _torch_action(action: Action) -> torch.profiler.ProfilerAction:
    return getattr(torch.profiler.ProfilerAction, action.name)


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _synchronize_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def resolve_activities(requested: list[str] | None) -> list[torch.profiler.ProfilerActivity]:
    """``--torch-profile-activities`` as torch activities: CPU, plus CUDA when available."""
    names = list(requested) if requested else ["cpu", "cuda"]
    activities = []
    for name in dict.fromkeys(names):
        if name == "cuda" and not torch.cuda.is_available():
            if requested:
                logger.warning("--torch-profile-activities cuda: CUDA is not available here; "
                               "recording CPU activity only")
            continue
        activities.append(getattr(torch.profiler.ProfilerActivity, name.upper()))
    return activities or [torch.profiler.ProfilerActivity.CPU]


class TorchProfiler:
    """A torch.profiler context manager driven by the schedule flags; see the module docstring."""

    def __init__(
        self,
        schedule: ProfileSchedule | None = None,
        *,
        output_dir: str = "./prof",
        record: bool = False,
        enabled: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        start_iteration: int = 0,
        activities: list[str] | None = None,
        profiler_options: dict[str, bool] | None = None,
        staging_dir: str | None = None,
        gzip_level: int | None = 6,
        summary_rows: int | None = 30,
        export_mode: str = "fork",
        flush_timeout: float = 1800.0,
        exit_timeout: float = 600.0,
        settings: dict[str, Any] | None = None,
        memory: MemorySnapshotter | None = None,
        nsys: NsysController | None = None,
        on_demand: OnDemandController | None = None,
    ) -> None:
        default_rank, default_world = _rank_and_world()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        #: The schedule is followed (traces, memory snapshots, nsys ranges).
        self._scheduled = enabled and schedule is not None
        self._on_demand = on_demand
        self.enabled = self._scheduled or on_demand is not None
        self.schedule = schedule or ProfileSchedule()
        self.record = self._scheduled and record
        self.output_dir = output_dir
        self.flush_timeout = flush_timeout
        self.exit_timeout = exit_timeout
        self.settings = dict(settings or {})
        self._first_iteration = start_iteration + 1
        self._iteration = start_iteration
        self._anchored = False
        self._next_busy_step = math.inf
        self._next_action = Action.NONE
        self._window_first: int | None = None
        self._discard_trace = False
        self._torch_profiler: torch.profiler.profile | None = None
        self._started = False
        self._broken = False
        self._barrier_group: Any = None
        self._previous_sigterm: Any = None
        self._last_flush_seconds = 0.0
        self._writer: TraceWriter | None = None
        self._activities = activities
        self._profiler_options = dict(profiler_options or {})
        # Kept only where they can work (CUDA present): said once now, before training, and the
        # hot path never looks at them again.
        self._memory = memory if memory is not None and memory.usable() else None
        self._nsys = nsys if nsys is not None and nsys.enabled else None
        #: nsys opens an NVTX range for every step; memory snapshots need only flush steps and
        #: multiples of their interval (see _plan_next).
        self._every_step = self._nsys is not None
        self._window: OnDemandWindow | None = None
        self._next_check: float = math.inf
        if self.enabled and self.world_size > 1 and dist.is_available() and dist.is_initialized():
            # Collective: every rank constructs the profiler, so every rank creates the group.
            self._barrier_group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=flush_timeout)
            )
        if on_demand is not None:
            on_demand.setup(self._barrier_group)  # collective; raises on every rank if unsafe
            self._next_check = on_demand.start_checks(start_iteration)
        if self.record or on_demand is not None:
            self._writer = TraceWriter(
                output_dir,
                choose_staging_dir(staging_dir),
                rank=self.rank,
                gzip_level=gzip_level,
                summary_rows=summary_rows,
                export_mode=export_mode,
                publish_timeout=flush_timeout,
            )

    # -- construction from flags ------------------------------------------------------------

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, start_iteration: int | None = None) -> TorchProfiler:
        """Build from parsed flags; call on every rank, after ``init_process_group`` if any.

        ``start_iteration`` is the number of optimizer steps already done (resume from a
        checkpoint); defaults to ``args.iteration`` (Megatron-LM sets it when loading a
        checkpoint), else 0.  Raises :class:`~torchprof_args.TorchProfileArgsError` for bad flags.
        """
        rank, world_size = _rank_and_world()
        validate_args(args, world_size=world_size)
        if start_iteration is None:
            start_iteration = int(getattr(args, "iteration", 0) or 0)
        check_kineto_daemon_env(rank)
        on_demand = None
        if getattr(args, "torch_profile_on_demand", False):
            on_demand = OnDemandController.from_args(args, rank=rank, world_size=world_size)
        elif not any_profiling_feature(args):
            return cls(None, enabled=False, rank=rank, world_size=world_size, start_iteration=start_iteration)
        ranks = args.torch_profile_ranks or [0]
        schedule = ProfileSchedule.from_args(args) if any_profiling_feature(args) else None
        options = {
            name: bool(getattr(args, f"torch_profile_{name}"))
            for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
        }
        output_dir = resolve_profile_dir(args)
        settings = {
            "schedule": schedule.describe() if schedule else "on demand only",
            "ranks": ranks if args.torch_profile else [],
            "activities": args.torch_profile_activities or "auto",
            **options,
        }
        return cls(
            schedule,
            output_dir=output_dir,
            record=bool(args.torch_profile) and ("all" in ranks or rank in ranks),
            rank=rank,
            world_size=world_size,
            start_iteration=start_iteration,
            activities=args.torch_profile_activities,
            profiler_options=options,
            staging_dir=args.torch_profile_staging_dir,
            gzip_level=args.torch_profile_gzip_level if args.torch_profile_gzip else None,
            summary_rows=args.torch_profile_summary_rows if args.torch_profile_summary else None,
            export_mode=args.torch_profile_export,
            flush_timeout=args.torch_profile_flush_timeout,
            exit_timeout=args.torch_profile_exit_timeout,
            settings=settings,
            memory=MemorySnapshotter.from_args(args, rank=rank),
            nsys=NsysController.from_args(args),
            on_demand=on_demand,
        )

    # -- context manager --------------------------------------------------------------------

    def __enter__(self) -> TorchProfiler:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._memory is not None and isinstance(exc, torch.OutOfMemoryError):
            self._memory.on_oom(self._iteration + 1)  # before the error unwinds any further
        self.stop(clean=exc_type is None)

    def start(self) -> None:
        """Begin following the schedule (``__enter__`` calls this)."""
        if not self.enabled or self._started:
            return
        self._started = True
        first = self._first_iteration
        self._install_sigterm_handler()
        if self._memory is not None:
            self._memory.start()
        if self._nsys is not None:
            self._nsys.on_step(first, recording=self.schedule.action(first, first) in _RECORDING)
        if self.record:
            logger.info("rank %d: profiling %s; traces go to %s", self.rank, self.schedule.describe(),
                        os.path.abspath(self.output_dir))
            self._start_torch_profiler(first)
        if self._on_demand is not None:
            self._on_demand.open()
        self._next_busy_step = -math.inf  # the first step() call anchors the numbering

    def _start_torch_profiler(self, first: int) -> None:
        """Create and start torch.profiler in the state this rank's action for ``first`` asks for."""
        self._next_action = self._local_action(first)
        if self._next_action in _RECORDING:
            self._window_first = first
        try:
            self._torch_profiler = torch.profiler.profile(
                activities=resolve_activities(self._activities),
                schedule=lambda _step: _torch_action(self._next_action),
                on_trace_ready=self._on_trace_ready,
                **self._profiler_options,
            )
            self._torch_profiler.step_num = first
            self._torch_profiler.start()
            if self._window_first == first:
                self._add_trace_metadata(first)
        except Exception as err:
            self._disable_after_error("starting the profiler", err)

    def stop(self, clean: bool = True) -> None:
        """Finish: flush a partly recorded window (``clean``), wait for pending publications.

        ``clean`` is False when leaving on an exception: ranks are then not in step, so there is
        no barrier and a partly recorded window is dropped.
        """
        if not self._started:
            return
        self._started = False
        last = self._iteration
        partial = clean and self._global_action(last) is Action.RECORD
        if self._torch_profiler is not None and not self._broken:
            self._discard_trace = not partial
            try:
                self._torch_profiler.stop()
            except Exception as err:
                self._disable_after_error("stopping the profiler", err)
            self._discard_trace = False
        self._torch_profiler = None
        if partial:
            self._flush_barrier(last)
        if self._nsys is not None:
            self._nsys.close()
        if self._memory is not None:
            self._memory.close()
        self._window = None
        if self._on_demand is not None:
            self._on_demand.close()
        if self._writer is not None:
            self._writer.close(self.exit_timeout)
        self._restore_sigterm_handler()

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
        if self._torch_profiler is None and upcoming is not Action.NONE and not self._broken:
            self._start_torch_profiler(iteration + 1)  # first on-demand window on this rank
        elif self._torch_profiler is not None and not self._broken:
            if upcoming in _RECORDING and self._local_action(iteration) not in _RECORDING:
                self._window_first = iteration + 1
            self._next_action = upcoming
            self._torch_profiler.step_num = iteration
            try:
                self._torch_profiler.step()  # stops, and calls _on_trace_ready, at a flush step
            except Exception as err:
                self._disable_after_error(f"stepping the profiler at iteration {iteration}", err)
            else:
                if self._window_first == iteration + 1:
                    self._add_trace_metadata(iteration + 1)
        if self._memory is not None:  # before the barrier, so a slow dump is fenced too
            scheduled_flush = self._scheduled_action(iteration) is Action.RECORD_AND_SAVE
            self._memory.on_step(iteration, profiled_cycle_ended=scheduled_flush)
        if current is Action.RECORD_AND_SAVE:
            self._flush_barrier(iteration)
            self._last_flush_seconds = time.perf_counter() - started
        if self._nsys is not None:
            self._nsys.on_step(iteration + 1, recording=self._scheduled_action(iteration + 1) in _RECORDING)
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
        """The action every rank agrees on (flush barriers): the schedule's, else the on-demand window's."""
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
        window = self._on_demand.poll(
            iteration, self._barrier_group,
            busy=lambda i: self._scheduled_action(i) is not Action.NONE,
        )
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
            logger.warning("rank %d: the run started at iteration %d, inside --torch-profile-step-start"
                           "/-end; pass start_iteration to TorchProfiler.from_args (or set "
                           "args.iteration) so the window is not missed", self.rank, iteration)

    # -- flushing ---------------------------------------------------------------------------

    def _on_trace_ready(self, torch_profiler: torch.profiler.profile) -> None:
        """Called by torch.profiler on the training thread right after it stopped recording."""
        if self._discard_trace or self._writer is None:
            return
        last = self._iteration
        first = self._window_first if self._window_first is not None else last
        self._window_first = None
        self._writer.submit(torch_profiler.export_chrome_trace, trace_stem(self.rank, first, last))

    def _add_trace_metadata(self, first: int) -> None:
        """Put the run's settings in the trace (Kineto takes metadata only while recording)."""
        last = first
        while self._global_action(last) is Action.RECORD:
            last += 1
        metadata = {**self.settings, "rank": self.rank, "world_size": self.world_size,
                    "host": short_hostname(), "iterations": [first, last]}
        if self._window is not None and self._window.start <= first < self._window.end:
            metadata["on_demand_request"] = self._window.request_id
        try:
            self._torch_profiler.add_metadata_json("torchprof_args", json.dumps(metadata))
        except Exception as err:
            logger.warning("rank %d: could not add metadata to the trace: %s", self.rank, err)

    def _flush_barrier(self, iteration: int) -> None:
        """All ranks meet here after a flush: device synchronised, then a gloo barrier."""
        try:
            _synchronize_device()
        except Exception as err:
            logger.error("rank %d: device synchronize before the flush barrier failed: %s", self.rank, err)
        if self._barrier_group is None:
            return
        try:
            dist.monitored_barrier(
                group=self._barrier_group,
                timeout=datetime.timedelta(seconds=self.flush_timeout),
                wait_all_ranks=True,
            )
        except Exception as err:
            logger.error("rank %d: flush barrier at iteration %d failed (%s); training continues. "
                         "Raise --torch-profile-flush-timeout if exports take longer.", self.rank,
                         iteration, err)

    def _disable_after_error(self, what: str, err: BaseException) -> None:
        self._broken = True
        logger.error("rank %d: profiling disabled after an error while %s: %s: %s; training continues",
                     self.rank, what, type(err).__name__, err)
        profiler, self._torch_profiler = self._torch_profiler, None
        if profiler is not None:
            self._discard_trace = True
            with contextlib.suppress(Exception):
                profiler.stop()
            self._discard_trace = False

    # -- signals ----------------------------------------------------------------------------

    def _install_sigterm_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        self._previous_sigterm = previous

        def on_sigterm(signum: int, frame: Any) -> None:
            logger.warning("rank %d: SIGTERM received; finishing pending traces before exit", self.rank)
            if callable(previous):
                previous(signum, frame)  # the application's own handler decides how to exit
            elif previous != signal.SIG_IGN:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm_handler(self) -> None:
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

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
