"""The Lightning integration behind :mod:`torchprof_args.lightning` (its docstring shows the use):
a ``Callback`` that steps the profiler on optimizer steps and writes the step timers to Lightning's
loggers."""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.profilers import PassThroughProfiler

from torchprof_args import _dist
from torchprof_args.capture.config import RunConfig, configs_from_args
from torchprof_args.capture.frameworks.hosted_profiling import FLUSH_TIMER, HostedProfiling
from torchprof_args.errors import TorchProfileArgsError

__all__ = ["FLUSH_TIMER", "TorchProfileCallback"]

_FORWARD_BACKWARD, _OPTIMIZER = "forward-backward", "optimizer"


class TorchProfileCallback(pl.Callback):
    """``pl.Trainer(callbacks=[TorchProfileCallback(args)])``: ``args`` holds the parsed
    ``--torch-profile-*`` / ``--metrics-*`` flags (``add_torch_profile_args``), checked here.

    ``setup`` (every rank, the process group up) checks the flags against the world size and refuses
    Lightning's own ``profiler=`` with ``--torch-profile``; ``on_train_start`` starts the profiler at
    ``trainer.global_step`` (a resumed fit continues the numbering) and records the strategy in the
    trace metadata.  After each optimizer step (``trainer.global_step`` grew; gradient-accumulation
    micro-batches do not step it) the profiler steps with the global step, every flush fenced; every
    ``log_every_n_steps`` steps the timers (``forward-backward``, ``optimizer``,
    ``torch-profile-flush``), ``iteration-time``, ``throughput`` and ``mfu`` go, max across ranks, to
    ``trainer.loggers``.  Model FLOPs per step come from ``--metrics-flops-per-iteration``, else the
    module's ``flops_per_batch`` (Lightning's ``ThroughputMonitor`` convention) x accumulated batches
    x world size.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run: RunConfig = configs_from_args(args)
        self.profiling: HostedProfiling | None = None
        self._last_step = 0

    # -- set-up and tear-down --------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.run = configs_from_args(self.args, world_size=trainer.world_size)
        own = getattr(trainer, "profiler", None)  # set by Lightning's profiler connector
        if self.run.profiler.enabled and own is not None and not isinstance(own, PassThroughProfiler):
            raise TorchProfileArgsError(
                f"--torch-profile cannot run together with Lightning's Trainer(profiler="
                f"{type(own).__name__}): both drive torch.profiler or time the same hooks. "
                "Drop profiler= (--torch-profile-step-start/-end choose the steps).")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Every rank, after a checkpoint (``ckpt_path``) was restored: start at its global step."""
        if self.profiling is not None:
            return
        start = int(trainer.global_step)
        self.profiling = HostedProfiling(self.run, start_iteration=start, metadata={
            "parallel": {"dp": _dist.rank()}, "trainer": {
                "framework": f"lightning {pl.__version__}", "strategy": type(trainer.strategy).__name__,
                "world_size": int(trainer.world_size),
                "accumulate_grad_batches": int(trainer.accumulate_grad_batches)}})
        self._last_step = start
        self.profiling.start()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(clean=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._finish(clean=False)

    def _finish(self, *, clean: bool) -> None:
        if self.profiling is not None:
            self.profiling.close(clean=clean)
        self.profiling = None

    # -- each batch and optimizer step -----------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.profiling is not None:
            self.profiling.timer(_FORWARD_BACKWARD, start=True)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        if self.profiling is not None:
            self.profiling.timer(_FORWARD_BACKWARD, start=False)
            self.profiling.timer(_OPTIMIZER, start=True)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        """After every micro-batch; acts once ``trainer.global_step`` grew (an optimizer step)."""
        step = int(trainer.global_step)
        profiling = self.profiling
        if profiling is None or step == self._last_step:
            return
        profiling.timer(_OPTIMIZER, start=False)
        profiling.step(step)
        interval = int(getattr(trainer, "log_every_n_steps", 50) or 50)
        if step // interval > self._last_step // interval:
            self._log(trainer, pl_module, profiling, step)
        self._last_step = step

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, profiling: HostedProfiling,
             step: int) -> None:
        """Every rank (one gather), then the loggers (Lightning writes on global rank 0 only)."""
        per_batch = getattr(pl_module, "flops_per_batch", None)
        flops = (float(per_batch) * trainer.accumulate_grad_batches * trainer.world_size
                 if per_batch and not self.run.metrics.flops_per_iteration else None)
        figures = profiling.figures(step, flops)
        for each in trainer.loggers if figures else ():
            each.log_metrics(figures, step=step)
