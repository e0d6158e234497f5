"""The torchtitan trainer under ``TorchProfiler``: a mixin put in front of the trainer class that
the config's ``_owner`` names (see :mod:`~torchprof_args.capture.frameworks.torchtitan_config`).

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
* The MoE layers' routed tokens per expert (their ``tokens_per_expert_E``), per layer and recorded
  step, go with each trace into the cycle folder's ``expert_tokens/`` (``TorchProfiler.watch_experts``
  on every model part, with the expert-parallel group's ranks from torchtitan's ``ep`` mesh), for
  ``torchprof diagnose``'s ``expert_imbalance``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchprof_args import _dist
from torchprof_args.capture.frameworks.hosted_profiling import FLUSH_TIMER, HostedProfiling
from torchprof_args.capture.frameworks.torchtitan_config import run_config
from torchprof_args.capture.runtime.profiler import TorchProfiler
from torchprof_args.log import get_logger

__all__ = ["FLUSH_TIMER", "STEP_TIMER", "TitanProfiling", "TorchProfileTrainerMixin"]

STEP_TIMER = "step"

logger = get_logger(__name__)


class TitanProfiling:
    """The profiling of one torchtitan trainer's ``train()`` (every rank)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.run = run_config(trainer.config, world_size=_dist.world_size())
        self.hosted: HostedProfiling | None = None
        self._logged_step = 0

    def start(self, start_iteration: int) -> None:
        """Collective: every rank, before its first step of this run."""
        self.hosted = HostedProfiling(self.run, start_iteration=start_iteration,
                                      metadata=titan_layout(self.trainer))
        self._logged_step = start_iteration
        self._wrap_metrics_log()
        watch_titan_experts(self.hosted.prof, self.trainer)
        self.hosted.start()

    def close(self, clean: bool) -> None:
        if self.hosted is not None:
            self.hosted.close(clean=clean)
        processor = getattr(self.trainer, "metrics_processor", None)
        if processor is not None:
            vars(processor).pop("log", None)
        self.hosted = None

    def timed_step(self, step: int, train_step: Callable[[], Any]) -> Any:
        """``train_step()`` timed as ``step``, then the profiler's step (not after an exception)."""
        hosted = self.hosted
        if hosted is None:
            return train_step()
        hosted.timer(STEP_TIMER, start=True)
        try:
            result = train_step()
        finally:
            hosted.timer(STEP_TIMER, start=False)
        hosted.step(step)
        return result

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
        """Every rank, at each metrics log: the gathered figures."""
        if self.hosted is None:
            return {}
        steps = max(1, step - self._logged_step)
        self._logged_step = step
        return self.hosted.figures(step, model_flops_per_step(processor, steps))


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


def titan_ep_ranks(dims: Any) -> list[int] | None:
    """The global ranks of this rank's expert-parallel group (torchtitan's ``ep`` mesh, in its order);
    None without expert parallelism or where the mesh does not say."""
    if int(getattr(dims, "ep", 1)) <= 1:
        return None
    try:
        import torch.distributed as dist

        mesh = dims.get_optional_mesh("ep")
        return None if mesh is None else [int(r) for r in dist.get_process_group_ranks(mesh.get_group())]
    except Exception:  # noqa: BLE001 - a release or layout without it: the file says "not known"
        return None


def watch_titan_experts(prof: TorchProfiler, trainer: Any) -> int:
    """Every model part's MoE layers watched for their tokens per expert; returns how many."""
    dims = getattr(trainer, "parallel_dims", None)
    ep_ranks = titan_ep_ranks(dims) if dims is not None else None
    try:
        parts = getattr(trainer, "model_parts", [])
        return sum(prof.watch_experts(part, ep_ranks=ep_ranks) for part in parts)
    except ValueError as err:  # layers of different expert counts: no per-expert file, training goes on
        logger.warning("torchtitan's tokens per expert are not recorded: %s", err)
        return 0


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
        parent_step = super().train_step  # type: ignore[misc]
        profiling = self._torchprof
        if profiling is None:
            return parent_step(data_iterator)
        step = int(self.step)  # type: ignore[attr-defined]  # torchtitan counts before calling
        if profiling.hosted is None:
            profiling.start(start_iteration=step - 1)
        return profiling.timed_step(step, lambda: parent_step(data_iterator))
