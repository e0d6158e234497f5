"""``TorchProfileCallback``: the profiler, step timers, throughput and MFU under Hugging Face's
``Trainer`` (and every trainer built on it: TRL's ``SFTTrainer``, ...), as a ``TrainerCallback``.

* ``on_train_begin`` (every rank, after a resumed checkpoint's state is loaded): the profiler starts
  at ``state.global_step``, the trace metadata records the Trainer's parallel layout.
* ``on_step_end``: ``prof.step(state.global_step)``: ``ProfilerStep#N`` is optimizer step N, the
  gradient-accumulation micro-steps inside it; a flush waits at the fence like everywhere else.
* Timers: ``forward-backward`` (the step's micro-batches, to ``on_pre_optimizer_step``),
  ``optimizer`` and ``torch-profile-flush`` (the profiler's step).
* ``on_log`` at each training log (every rank: ``logging_steps``): one gather of every rank's
  readings (:class:`~torchprof_args.capture.metrics.writer.MetricsWriter` without sinks of its own) whose
  figures (``iteration-time``, ``timers/...``, ``throughput`` = TFLOP/s per GPU from the Trainer's
  own ``floating_point_ops`` via ``state.total_flos``, ``mfu``, ``memory/...``, ``profiler/...``) are
  added to the Trainer's ``logs``: ``trainer.state.log_history`` and every ``report_to`` sink get them
  (the callback places itself before the reporting callbacks when the Trainer is built).
* ``on_train_end``: the profiler stops (a window still recording is flushed, publications waited
  for, every rank meets at the fence).  The Trainer has no hook for an exception leaving ``train()``:
  then the profiler stops at interpreter exit, without the fence.
"""

from __future__ import annotations

import atexit
import sys
import time
from types import FrameType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from torchprof_args import _dist
from torchprof_args.capture.frameworks.hosted_profiling import FLUSH_TIMER, HostedProfiling
from torchprof_args.capture.frameworks.huggingface_args import TorchProfileArgumentsBase
from torchprof_args.capture.frameworks.huggingface_layout import trainer_layout
from torchprof_args.log import get_logger

__all__ = ["FLUSH_TIMER", "TorchProfileCallback"]

logger = get_logger(__name__)

_FORWARD_BACKWARD, _OPTIMIZER = "forward-backward", "optimizer"


class TorchProfileCallback(TrainerCallback):
    """``Trainer(..., callbacks=[TorchProfileCallback(profile_args)])`` on every rank; see the module
    docstring.  ``profile_args`` is a ``TorchProfileArguments`` (checked again here, and against the
    world size when training begins)."""

    def __init__(self, profile_args: TorchProfileArgumentsBase) -> None:
        self.profile_args = profile_args
        profile_args.run_config()
        self.profiling: HostedProfiling | None = None
        self._flos_logged = 0.0
        self._step_logged = 0
        self._ordered = False

    # -- set-up and tear-down --------------------------------------------------------------------

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._ordered = _run_before_reporters(self)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """Every rank, after the Trainer loaded a resumed checkpoint's state: start the profiler."""
        if self.profiling is not None:  # a second train() call on the same Trainer
            self._finish()
        start = int(state.global_step)
        run = self.profile_args.run_config()  # the process group exists now: its world size
        self.profiling = HostedProfiling(run, start_iteration=start,
                                         metadata=trainer_layout(args, _dist.rank()))
        self._flos_logged, self._step_logged = float(state.total_flos), start
        if not self._ordered:  # added with trainer.add_callback after the Trainer was built
            self._ordered = _run_before_reporters(self)
        if not self._ordered:
            logger.warning("TorchProfileCallback could not run before the report_to callbacks: its figures "
                           "reach trainer.state.log_history, but the report_to sinks only from the next log")
        self.profiling.start()
        atexit.register(self._abandon)  # train() raised: no on_train_end; the process is ending

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._finish()

    def _abandon(self) -> None:
        """At interpreter exit after an exception left ``trainer.train()``: stop without the exit fence
        (the ranks are not in step), publications get ``--torch-profile-exit-timeout``, staging is
        cleaned."""
        if self.profiling is not None:
            self.profiling.close(clean=False)
            self.profiling = None

    def _finish(self) -> None:
        atexit.unregister(self._abandon)
        if self.profiling is not None:
            self.profiling.close()
        self.profiling = None

    # -- each optimizer step ---------------------------------------------------------------------

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self._timer(_FORWARD_BACKWARD, start=True)

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        self._timer(_FORWARD_BACKWARD, start=False)
        self._timer(_OPTIMIZER, start=True)

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
        self._timer(_OPTIMIZER, start=False)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """After optimizer step ``state.global_step`` (never a micro-step): the profiler's step."""
        if self.profiling is not None:
            self.profiling.step(int(state.global_step))

    def _timer(self, name: str, *, start: bool) -> None:
        if self.profiling is not None:
            self.profiling.timer(name, start=start)

    # -- each training log -----------------------------------------------------------------------

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        """Every rank, at each training log (the Trainer logs on every rank; only the main process
        reports): gather the interval's figures and add them to ``logs`` and the log history."""
        if logs is None or "loss" not in logs or self.profiling is None:
            return
        step = int(state.global_step)
        steps = max(1, step - self._step_logged)
        flops = (float(state.total_flos) - self._flos_logged) / steps or None
        self._flos_logged, self._step_logged = float(state.total_flos), step
        started = time.perf_counter()
        figures = self.profiling.figures(step, flops)
        if not figures:
            return
        figures["profiler/metrics-gather-seconds"] = time.perf_counter() - started
        logs.update(figures)
        if state.log_history and state.log_history[-1].get("step") == step:
            state.log_history[-1].update(figures)


def _run_before_reporters(callback: TorchProfileCallback) -> bool:
    """Move ``callback`` right after the Trainer's DefaultFlowCallback, ahead of the ``report_to``
    callbacks, so that the figures it adds to ``logs`` reach them.  Called from the handler's
    ``on_init_end`` (the Trainer keeps its callbacks in a list it iterates by index: moving an item
    that is being called towards the front leaves the rest of the iteration as it was); again from
    ``on_train_begin`` for a callback added with ``trainer.add_callback``."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(4):
        if frame is None:
            break
        handler = frame.f_locals.get("self")
        if isinstance(handler, CallbackHandler) and callback in handler.callbacks:
            callbacks = handler.callbacks
            callbacks.remove(callback)
            first = 1 if callbacks and isinstance(callbacks[0], DefaultFlowCallback) else 0
            callbacks.insert(first, callback)
            return True
        frame = frame.f_back
    return False
