"""What every trainer integration with loggers of its own runs (Hugging Face's ``Trainer``, Lightning,
torchtitan): the profiler stepped with the trainer's optimizer-step number, the step timers, and one
gather of every rank's figures per log, handed to the trainer's loggers instead of the metrics
writer's sinks."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torchprof_args.capture.config import RunConfig
from torchprof_args.capture.metrics.timers import Timers
from torchprof_args.capture.metrics.writer import MetricsWriter
from torchprof_args.capture.runtime.profiler import TorchProfiler
from torchprof_args.log import get_logger

__all__ = ["FLUSH_TIMER", "HostedProfiling"]

logger = get_logger(__name__)

#: Timer of the profiler's step (a flush when a window ends), as under Megatron-LM.
FLUSH_TIMER = "torch-profile-flush"


class HostedProfiling:
    """The profiler, timers and figures of one run under a host trainer (every rank).

    Args:
        run: checked configs (:func:`~torchprof_args.capture.config.configs_from_args`).
        start_iteration: optimizer steps already done (a resumed checkpoint's step).
        metadata: what each trace's ``torchprof_args`` metadata records (``parallel``, ``trainer``).
    """

    def __init__(self, run: RunConfig, *, start_iteration: int, metadata: Mapping[str, Any]) -> None:
        self.prof = TorchProfiler.from_config(run, start_iteration=start_iteration)
        self.prof.add_trace_metadata(**metadata)
        self.timers = Timers.from_config(run.timers)
        self.writer = MetricsWriter(dataclasses.replace(run.metrics, sinks=()), timers=self.timers,
                                    start_iteration=start_iteration, console=False)

    def start(self) -> None:
        """Collective: every rank, before its first step."""
        self.prof.start()

    def close(self, clean: bool = True) -> None:
        """Stop the profiler (``clean``: flush a window still recording, meet at the exit fence)."""
        self.prof.stop(clean=clean)
        self.writer.close()

    def timer(self, name: str, *, start: bool) -> None:
        """Start or stop the level-0 timer ``name``; a repeated start or stop is ignored (a host
        hook that fires twice must not stop training)."""
        timer = self.timers(name, log_level=0)
        running = bool(getattr(timer, "_started", False))
        if start and not running:
            timer.start()
        elif not start and running:
            timer.stop()

    def step(self, iteration: int) -> None:
        """After optimizer step ``iteration``: the profiler's step, timed as ``torch-profile-flush``."""
        self.timer(FLUSH_TIMER, start=True)
        try:
            self.prof.step(iteration)
        finally:
            self.timer(FLUSH_TIMER, start=False)

    def figures(self, iteration: int, flops: float | None = None) -> dict[str, float]:
        """Every rank, at the host's log: one gather of the interval's figures (``iteration-time``,
        ``timers/...``, ``throughput`` and ``mfu`` from ``flops``, the model FLOPs of one step, all
        ranks, else ``--metrics-flops-per-iteration``; ``memory/...``, ``profiler/...``); ``{}``
        with a warning if the gather failed: metrics never stop training."""
        try:
            return self.writer.log_step(iteration, flops=flops, extra=self.prof.stats)
        except Exception as err:  # noqa: BLE001
            logger.warning("could not gather the step timers at step %d: %s: %s", iteration,
                           type(err).__name__, err)
            return {}
