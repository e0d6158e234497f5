"""The torchtitan trainer under ``TorchProfiler``: a mixin put in front of the trainer class that
the config's ``_owner`` names (see :mod:`~torchprof_args.frameworks.torchtitan_config`).

* ``train()``: the profiler stops when it returns or raises (a clean return flushes a window still
  recording and meets every rank at the fence).
* ``train_step()``: the first call starts the profiler (after torchtitan loaded a checkpoint:
  numbering continues from its step); after each call, one optimizer step, ``prof.step(self.step)``
  (``ProfilerStep#N`` is torchtitan's step N, its gradient-accumulation micro-batches inside), timed
  with the ``step`` and ``torch-profile-flush`` timers.
* The metrics processor's ``log`` (every rank, at ``--metrics.log_freq``) gets, in its
  ``extra_metrics``, one gather of every rank's readings: ``iteration-time``, the timers with their
  slowest rank and straggler scores, ``throughput`` (TFLOP/s per GPU) and ``mfu`` from torchtitan's
  own ``num_flops_per_token`` (against ``--torch_profile.metrics_peak_tflops`` or the device table),
  ``profiler/...``: its TensorBoard and wandb loggers write them with its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torchprof_args import _dist
from torchprof_args.frameworks.torchtitan_config import run_config
from torchprof_args.log import get_logger
from torchprof_args.metrics.timers import Timers
from torchprof_args.metrics.writer import MetricsWriter
from torchprof_args.runtime.profiler import TorchProfiler

__all__ = ["FLUSH_TIMER", "STEP_TIMER", "TitanProfiling", "TorchProfileTrainerMixin"]

logger = get_logger(__name__)

FLUSH_TIMER, STEP_TIMER = "torch-profile-flush", "step"


class TitanProfiling:
    """The profiler, timers and figures of one torchtitan trainer (every rank)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.run = run_config(trainer.config, world_size=_dist.world_size())
        self.prof: TorchProfiler | None = None
        self.timers = Timers.from_config(self.run.timers)
        self.writer: MetricsWriter | None = None
        self._logged_step = 0

    def start(self, start_iteration: int) -> None:
        """Collective: every rank, before its first step of this run."""
        self.prof = TorchProfiler.from_config(self.run, start_iteration=start_iteration)
        self.prof.add_trace_metadata(**titan_layout(self.trainer))
        self.writer = MetricsWriter(dataclasses.replace(self.run.metrics, sinks=()), timers=self.timers,
                                    start_iteration=start_iteration, console=False)
        self._logged_step = start_iteration
        self._wrap_metrics_log()
        self.prof.start()

    def close(self, clean: bool) -> None:
        if self.prof is not None:
            self.prof.stop(clean=clean)
        if self.writer is not None:
            self.writer.close()
        processor = getattr(self.trainer, "metrics_processor", None)
        if processor is not None:
            vars(processor).pop("log", None)
        self.prof = self.writer = None

    def timed(self, name: str, call: Callable[[], Any]) -> Any:
        timer = self.timers(name, log_level=0)
        timer.start()
        try:
            return call()
        finally:
            timer.stop()

    def step(self, step: int) -> None:
        if self.prof is not None:
            self.timed(FLUSH_TIMER, lambda: self.prof.step(step) if self.prof is not None else None)

    # -- into torchtitan's metrics processor ---------------------------------------------------

    def _wrap_metrics_log(self) -> None:
        processor = self.trainer.metrics_processor
        original = processor.log

        def log(step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
                extra_metrics: dict[str, Any] | None = None) -> Any:
            figures = self.interval_figures(step, processor)
            return original(step, global_avg_loss, global_max_loss, grad_norm,
                            extra_metrics={**(extra_metrics or {}), **figures})

        processor.log = log

    def interval_figures(self, step: int, processor: Any) -> dict[str, float]:
        """Every rank, at each metrics log: the gathered figures (``{}`` if the gather failed)."""
        if self.writer is None or self.prof is None:
            return {}
        steps = max(1, step - self._logged_step)
        self._logged_step = step
        flops = model_flops_per_step(processor, steps)
        try:
            return self.writer.log_step(step, flops=flops, extra=self.prof.stats)
        except Exception as err:  # noqa: BLE001 - metrics never stop training
            logger.warning("could not gather the step timers at step %d: %s: %s", step, type(err).__name__,
                           err)
            return {}


def model_flops_per_step(processor: Any, steps: int) -> float | None:
    """Model FLOPs of one optimizer step, all ranks together, from torchtitan's own count:
    ``num_flops_per_token`` x the tokens this rank saw since the last log x the data-parallel
    replicas (world size over the non-data-parallel size), per step."""
    per_token = getattr(processor, "num_flops_per_token", -1)
    tokens = getattr(processor, "ntokens_since_last_log", 0)
    dims = getattr(processor, "parallel_dims", None)
    if per_token <= 0 or not tokens or dims is None:
        return None
    replicas = dims.world_size / max(1, dims.non_data_parallel_size)
    return float(per_token) * tokens * replicas / steps


def titan_layout(trainer: Any) -> dict[str, Any]:
    """``{"parallel": {...}, "trainer": {...}}`` from torchtitan's ``ParallelDims``: this rank's
    coordinates where the meshes say them, the degrees, gradient accumulation."""
    dims = trainer.parallel_dims
    axes = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
    degrees = {name: int(getattr(dims, name, 1)) for name in axes}
    coordinates: dict[str, int] = {}
    for axis, mesh_name in (("dp", "batch"), ("tp", "tp"), ("pp", "pp"), ("cp", "cp")):
        try:
            mesh = dims.get_optional_mesh(mesh_name)
            if mesh is not None:
                coordinates[axis] = int(mesh.get_local_rank())
        except Exception:  # noqa: BLE001 - an axis this release or layout lacks
            continue
    import torchtitan

    return {"parallel": coordinates or {"dp": _dist.rank()}, "trainer": {
        "framework": f"torchtitan {torchtitan.__version__}", "degrees": degrees,
        "world_size": int(dims.world_size),
        "gradient_accumulation_steps": int(getattr(trainer, "gradient_accumulation_steps", 1))}}


class TorchProfileTrainerMixin:
    """In front of torchtitan's ``Trainer`` (or its subclass): see the module docstring."""

    _torchprof: TitanProfiling | None = None

    def train(self) -> Any:
        self._torchprof = TitanProfiling(self)
        clean = False
        try:
            result = super().train()  # type: ignore[misc]
            clean = True
            return result
        finally:
            self._torchprof.close(clean=clean)
            self._torchprof = None

    def train_step(self, data_iterator: Any) -> Any:
        profiling = self._torchprof
        step = int(self.step)  # type: ignore[attr-defined]  # torchtitan counts before calling
        if profiling is not None and profiling.prof is None:
            profiling.start(start_iteration=step - 1)
        if profiling is None:
            return super().train_step(data_iterator)  # type: ignore[misc]
        parent_step = super().train_step  # type: ignore[misc]
        result = profiling.timed(STEP_TIMER, lambda: parent_step(data_iterator))
        profiling.step(step)
        return result
