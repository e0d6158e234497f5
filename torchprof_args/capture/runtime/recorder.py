"""One rank's torch.profiler session, driven one action at a time by :class:`TorchProfiler`.

torch.profiler's own schedule counts steps from its creation; ours follows global iterations
and on-demand windows.  So the ``torch.profiler.profile`` here gets a schedule that answers
whatever action :class:`Recorder` was told for the next step, and its ``step_num`` is kept equal
to the global iteration (``ProfilerStep#N`` in the trace is iteration N).  With an
:class:`~torchprof_args.capture.runtime.companions.execution_trace.ExecutionTrace` set, each recorded
window also gets PyTorch's execution trace, and with an
:class:`~torchprof_args.capture.runtime.companions.expert_tokens.ExpertTokenCounter` set
(``TorchProfiler.watch_experts``) the MoE layers' routed tokens per expert of each recorded step.
A flushed window goes straight to the
:class:`~torchprof_args.capture.runtime.export.writer.TraceWriter`.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from typing import TYPE_CHECKING, Any

import torch

from torchprof_args.capture.runtime.companions.execution_trace import ExecutionTrace
from torchprof_args.capture.runtime.companions.expert_tokens import ExpertTokenCounter
from torchprof_args.capture.runtime.config import TraceConfig
from torchprof_args.capture.runtime.export.child import Companion
from torchprof_args.capture.runtime.export.writer import Route
from torchprof_args.capture.runtime.inductor.kernel_modules import write_kernel_modules
from torchprof_args.capture.runtime.schedule import RECORDING, Action
from torchprof_args.log import get_logger

if TYPE_CHECKING:
    from torchprof_args.capture.runtime.export.writer import TraceWriter

__all__ = ["RECORDING", "Recorder", "resolve_activities"]

logger = get_logger(__name__)

# Clearing events between cycles is exactly what we want: one trace per cycle.
warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")


def resolve_activities(
        requested: tuple[str, ...] | list[str] | None) -> list[torch.profiler.ProfilerActivity]:
    """``--torch-profile-activities`` as torch activities: CPU, plus CUDA when available."""
    names = list(requested) if requested else ["cpu", "cuda"]
    activities = []
    for name in dict.fromkeys(names):
        if name == "cuda" and not torch.cuda.is_available():
            if requested:
                logger.warning("--torch-profile-activities cuda: CUDA is not available here; recording CPU "
                               "activity only")
            continue
        activities.append(getattr(torch.profiler.ProfilerActivity, name.upper()))
    return activities or [torch.profiler.ProfilerActivity.CPU]


class Recorder:
    """A ``torch.profiler.profile`` whose every transition :class:`TorchProfiler` decides.

    Errors never escape: the first one disables recording on this rank (``broken``), is logged
    with the rank, and training goes on.
    """

    def __init__(self, config: TraceConfig, *, rank: int) -> None:
        self.config = config
        self.rank = rank
        self.broken = False
        self._profiler: torch.profiler.profile | None = None
        self._next_action = Action.NONE
        self._window_first: int | None = None
        self._iteration = 0
        self._discard = False
        self._categorised = False  # a window of this run got PyTorch's memory categorisation
        #: Set by the profiler at start: where flushed windows go (it knows the staging directory).
        self.writer: TraceWriter | None = None
        #: Set by the profiler with --torch-profile-execution-trace.
        self.execution_trace: ExecutionTrace | None = None
        #: Set by TorchProfiler.watch_experts: the MoE layers' tokens per expert of each recorded step.
        self.expert_tokens: ExpertTokenCounter | None = None

    @property
    def active(self) -> bool:
        return self._profiler is not None

    @property
    def in_window(self) -> bool:
        """A window records now (from its first step to its flush)."""
        return self._profiler is not None and self._window_first is not None

    def start(self, first: int, action: Action) -> bool:
        """Create and start torch.profiler in the state ``action`` asks for iteration ``first``.

        Returns True when a window starts recording at ``first`` (time to add its metadata).
        """
        self._next_action = action
        self._window_first = first if action in RECORDING else None
        self._iteration = first - 1
        try:
            self._profiler = torch.profiler.profile(
                activities=resolve_activities(self.config.activities),
                schedule=lambda _step: getattr(torch.profiler.ProfilerAction, self._next_action.name),
                on_trace_ready=self._on_trace_ready,
                **self.config.profiler_options(),
            )
            self._profiler.step_num = first
            if action in RECORDING:
                self._start_companions(first)
            self._profiler.start()
        except Exception as err:  # noqa: BLE001
            self.disable("starting the profiler", err)
            return False
        return self._window_first == first

    def step(self, iteration: int, current: Action, upcoming: Action) -> bool:
        """End ``iteration`` (whose action was ``current``) and enter ``upcoming``; torch.profiler
        starts here when this rank's first window (on demand) comes up.

        A flush happens inside (to the writer).  Returns True when a window starts recording at
        ``iteration + 1``.
        """
        if self._profiler is None:
            if upcoming is Action.NONE or self.broken:
                return False
            return self.start(iteration + 1, upcoming)
        if current in RECORDING and self.expert_tokens is not None:
            self.expert_tokens.end_step(iteration)
        if upcoming in RECORDING and current not in RECORDING:
            self._window_first = iteration + 1
            self._start_companions(iteration + 1)  # before torch.profiler opens ProfilerStep#N+1
        self._next_action = upcoming
        self._iteration = iteration
        self._profiler.step_num = iteration
        actions = torch.profiler.ProfilerAction
        if current is Action.RECORD_AND_SAVE and self._profiler.current_action == actions.RECORD:
            # The window was cut short (low host memory): this step ends it.
            self._profiler.current_action = actions.RECORD_AND_SAVE
        try:
            self._profiler.step()  # stops, and calls _on_trace_ready, at a flush step
        except Exception as err:  # noqa: BLE001
            self.disable(f"stepping the profiler at iteration {iteration}", err)
            return False
        return self._window_first == iteration + 1

    def stop(self, iteration: int, keep: bool) -> None:
        """Stop for good; ``keep`` delivers a partly recorded window, else it is dropped."""
        profiler, self._profiler = self._profiler, None
        if profiler is None or self.broken:
            return
        self._iteration = iteration
        self._discard = not keep
        self._next_action = Action.NONE  # no window follows this one
        try:
            profiler.stop()
        except Exception as err:  # noqa: BLE001
            self.disable("stopping the profiler", err)
        finally:
            self._discard = False

    def add_metadata(self, metadata: dict[str, Any]) -> None:
        """Put the run's settings in the trace (Kineto takes metadata only while recording)."""
        if self._profiler is None:
            return
        try:
            self._profiler.add_metadata_json("torchprof_args", json.dumps(metadata))
        except Exception as err:  # noqa: BLE001
            logger.warning("rank %d: could not add metadata to the trace: %s", self.rank, err)

    def disable(self, what: str, err: BaseException) -> None:
        """Give up recording on this rank after ``err``; training goes on."""
        self.broken = True
        logger.error("rank %d: profiling disabled after an error while %s: %s: %s; training continues",
                     self.rank, what, type(err).__name__, err)
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            self._discard = True
            with contextlib.suppress(Exception):
                profiler.stop()
            self._discard = False
        if self.execution_trace is not None:
            self.execution_trace.discard()
        if self.expert_tokens is not None:
            self.expert_tokens.discard()

    def _start_companions(self, first: int) -> None:
        """A window opens at ``first``: its companions start (the execution trace, the tokens per expert)."""
        if self.execution_trace is not None:
            self.execution_trace.start(first)
        if self.expert_tokens is not None:
            self.expert_tokens.start()

    def _memory_companion(self, profiler: torch.profiler.profile) -> Companion | None:
        """PyTorch's memory categorisation for the forked exporter to run, when the window records
        what it needs (shapes, memory and stacks, as ``export_memory_timeline``) and
        ``--torch-profile-memory-categories`` asks for it in this window."""
        options = self.config.profiler_options()
        if not (options["profile_memory"] and options["record_shapes"] and options["with_stack"]):
            return None
        when = self.config.memory_categories
        if when == "off" or (when == "first" and self._categorised):
            return None
        from torchprof_args.analysis.staged import exporter_companion

        return exporter_companion(profiler)

    def _write_kernel_modules(self) -> None:
        """The kernel -> module map of the graphs compiled so far (``--torch-profile-compiled-modules``)."""
        try:
            write_kernel_modules(self.config.output_dir, self.rank)
        except (OSError, ValueError) as err:
            logger.warning("rank %d: --torch-profile-compiled-modules: the map not written (%s)",
                           self.rank, err)

    def _on_trace_ready(self, profiler: torch.profiler.profile) -> None:
        """Called by torch.profiler on the training thread right after it stopped recording."""
        execution_trace = self.execution_trace
        if self._discard:
            if execution_trace is not None:
                execution_trace.discard()
            if self.expert_tokens is not None:
                self.expert_tokens.discard()
            return
        last = self._iteration
        first = self._window_first if self._window_first is not None else last
        self._window_first = None
        finished = execution_trace.finish() if execution_trace is not None else None
        tokens = None
        if self.expert_tokens is not None:
            staging = self.writer.staging.dirs if self.writer is not None else []
            if staging:
                tokens = self.expert_tokens.finish(staging[0])
            else:
                self.expert_tokens.discard()
        if self.writer is not None:
            if self.config.compiled_modules:  # before the trace: a reader of the trace finds it
                self._write_kernel_modules()
            companion = self._memory_companion(profiler)
            submitted = self.writer.submit_window(profiler.export_chrome_trace, first, last, finished,
                                                  companion=companion, expert_tokens=tokens)
            # a window exported inline got no categorisation: the next one may have it
            self._categorised |= companion is not None and submitted.route is Route.FORKED
        elif finished is not None:
            finished.unlink(missing_ok=True)
        if self._next_action in RECORDING:
            self._start_companions(last + 1)  # a window that follows at once (no wait, no warmup)
