"""At each Megatron-LM log interval: TFLOP/s per GPU and MFU from Megatron-LM's own
``num_floating_point_operations``, the allocator and GPU readings of every rank, and the cross-rank
figures of Megatron's own ``Timers`` (slowest rank, straggler scores and warning).

No collective of its own: the readings ride in the timers' gather that Megatron's
``training_log`` already does (``timers.log``).  For Megatron's ``Timers`` class its
``_get_elapsed_time_all_ranks`` (one all-gather of ``[world, names]``) is replaced, on that
instance and while ``train()`` runs, by the same read through
:class:`~torchprof_args.capture.metrics.gather.RankGather` (one fixed-size all-gather carrying the per-rank
figures too); for ``torchprof_args.Timers`` its ``gather`` gets them as ``per_rank``.  The scalars
go through Megatron's TensorBoard and wandb writers: ``throughput`` (Megatron's key; skipped when
Megatron logs it itself, ``--log-throughput``), ``mfu``, ``memory/...``, ``gpu/...``,
``<timer>-time-max-rank`` and ``stragglers/<timer>-score-max``.
"""

from __future__ import annotations

import argparse
import inspect
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torchprof_args import _dist
from torchprof_args.capture.metrics.gather import RankGather, Request
from torchprof_args.capture.metrics.hardware import DeviceReadings
from torchprof_args.capture.metrics.health import AllocRetryWatch
from torchprof_args.capture.metrics.mfu import PeakResolver, flops_value, throughput_figures
from torchprof_args.capture.metrics.straggler_tracker import StragglerTracker, straggler_figures
from torchprof_args.log import get_logger

__all__ = ["MegatronIntervalMetrics", "megatron_flops"]

logger = get_logger(__name__)

#: training_log keyword arguments (core_v0.19.0) that num_floating_point_operations takes as well.
_THD_ARGUMENTS = ("seqlen_squared_sum_in_batch", "total_real_tokens_in_batch")


def megatron_flops(training: Any, args: argparse.Namespace, log_arguments: Mapping[str, Any]) -> float | None:
    """Model FLOPs of one iteration from Megatron-LM's ``num_floating_point_operations(args,
    batch_size, ...)``, with the global batch size computed as ``training_log`` does (both call
    shapes: core_v0.19.0 also passes the packed-sequence sums it got)."""
    function = getattr(training, "num_floating_point_operations", None)
    microbatches = getattr(training, "get_num_microbatches", None)
    if not callable(function) or not callable(microbatches):
        return None
    batch_size = (args.micro_batch_size * args.data_parallel_size * getattr(args, "gtp_weight_remat_size", 1)
                  * microbatches())
    parameters = inspect.signature(function).parameters
    extra = {name: log_arguments[name] for name in _THD_ARGUMENTS
             if name in parameters and log_arguments.get(name) is not None}
    return float(function(args, batch_size, **extra))


class MegatronIntervalMetrics:
    """Created by ``install()`` for one ``train()`` call (every rank); see the module docstring."""

    def __init__(self, training: Any, args: argparse.Namespace, timers: Any, writers: Iterable[Any]) -> None:
        from torchprof_args.capture.config import configs_from_args

        run = configs_from_args(args)
        self.training, self.args, self.timers = training, args, timers
        self.writers = [writer for writer in writers if writer is not None]
        self.log_interval = int(getattr(args, "log_interval", 1) or 1)
        self.flops_override = run.metrics.flops_per_iteration
        self.readings = DeviceReadings(hardware=run.metrics.gpu_hardware)
        self.peak = PeakResolver(run.metrics.peak_tflops, run.metrics.peak_dtype)
        self.stragglers = StragglerTracker(run.timers.straggler_threshold, run.timers.straggler_intervals,
                                           rank=_dist.rank())
        self.scored = run.timers.straggler_timers
        self.alloc_retries = AllocRetryWatch(rank=_dist.rank())
        self._gather = RankGather()
        self._last: tuple[list[str], list[list[float]], list[dict[str, float]], list[int]] | None = None
        self._last_iteration = int(getattr(args, "iteration", 0) or 0)
        self._last_time = time.perf_counter()
        self._patched: list[str] = []

    # -- riding on the timers' gather -----------------------------------------------------------

    def attach(self) -> None:
        """Route the timers' cross-rank read through one gather that also carries our figures."""
        timers = self.timers
        if timers is None:
            return
        if callable(getattr(timers, "gather", None)) and hasattr(timers, "interval_figures"):
            original = timers.gather

            def gather(names: Any = None, reset: bool = True, barrier: bool = False,
                       per_rank: Any = None) -> Any:
                snapshot = original(names, reset=reset, barrier=barrier,
                                    per_rank=self.readings.read() if per_rank is None else per_rank)
                self._last = (snapshot.names, snapshot.times, [f or {} for f in snapshot.per_rank],
                              snapshot.global_ranks or list(range(snapshot.world_size)))
                return snapshot

            timers.gather = gather
            self._patched.append("gather")
        elif callable(getattr(timers, "_get_elapsed_time_all_ranks", None)) and hasattr(timers, "_timers"):
            timers._get_elapsed_time_all_ranks = self._elapsed_all_ranks
            self._patched.append("_get_elapsed_time_all_ranks")

    def detach(self) -> None:
        for name in self._patched:
            vars(self.timers).pop(name, None)
        self._patched = []

    def _elapsed_all_ranks(self, names: Sequence[str], reset: bool, barrier: bool) -> Any:
        """Megatron's ``Timers._get_elapsed_time_all_ranks``: ``[world, names]`` seconds (0 where a
        rank has no such timer), as one fixed-size all-gather that carries this rank's figures."""
        import torch

        if barrier and _dist.dist_if_initialized() is not None:
            torch.distributed.barrier()
        names = list(names)
        local = {name: self.timers._timers[name].elapsed(reset=reset) for name in names
                 if name in self.timers._timers}
        figures = {k: v for k, v in self.readings.read().items() if math.isfinite(v)}
        agreement, rows = self._gather.gather(Request(tuple(names), False, tuple(figures)), local, figures)
        count = len(agreement.names)
        times = [row[:count] for row in rows]  # NaN where a rank has no such timer
        per_rank = [{k: v for k, v in zip(agreement.figures, row[count:], strict=True) if not math.isnan(v)}
                    for row in rows]
        self._last = (list(agreement.names), times, per_rank, list(agreement.global_ranks))
        if not names:
            return None
        return torch.tensor([[0.0 if math.isnan(t) else t for t in row] for row in times], dtype=torch.float)

    # -- once per log interval --------------------------------------------------------------------

    def after_training_log(self, iteration: int, log_arguments: Mapping[str, Any]) -> dict[str, float]:
        """Every rank, after Megatron's ``training_log``; acts at log intervals.  Returns the scalars."""
        if iteration % self.log_interval:
            return {}
        now = time.perf_counter()
        iterations = max(1, iteration - self._last_iteration)
        step_time = (now - self._last_time) / iterations
        self._last_iteration, self._last_time = iteration, now
        scalars: dict[str, float] = {}
        try:
            scalars.update(self._cross_rank(iteration, iterations))
            flops = (flops_value(self.flops_override, iteration)
                     or megatron_flops(self.training, self.args, log_arguments))
            figures = throughput_figures(step_time, _dist.world_size(), flops, self.peak)
            if getattr(self.args, "log_throughput", False):
                figures.pop("throughput", None)  # Megatron writes its own, from the same function
            scalars.update(figures)
            if _dist.rank() == _dist.world_size() - 1 and flops:
                logger.info("iteration %d: model FLOPs per iteration %.6g (Megatron-LM's num_floating_point_"
                            "operations) | TFLOP/s/GPU %.4g | MFU %s", iteration, flops,
                            flops / step_time / _dist.world_size() / 1e12,
                            f"{figures['mfu']:.3g} %" if "mfu" in figures else "n/a (--metrics-peak-tflops)")
            self._write(scalars, iteration)
        except Exception as err:  # noqa: BLE001 - metrics never stop training
            logger.warning("could not log the interval metrics at iteration %d: %s: %s", iteration,
                           type(err).__name__, err)
        return scalars

    def _cross_rank(self, iteration: int, iterations: int) -> dict[str, float]:
        """Slowest rank and straggler scores of the timers, the figures' max (and min for gpu/)."""
        if self._last is None:
            return {}
        names, times, per_rank, ranks = self._last
        self._last = None
        seconds = [[t / iterations for t in row] for row in times]
        scalars, scores = straggler_figures(names, seconds, ranks, self.scored)
        scalars = {(k[len("timers/"):] if k.startswith("timers/") else k): v for k, v in scalars.items()}
        self.stragglers.update(iteration, names, seconds, scores, ranks, hardware=per_rank)
        self.alloc_retries.update(iteration, per_rank, ranks)
        keys = dict.fromkeys(key for figures in per_rank for key in figures)
        for key in keys:
            present = [figures[key] for figures in per_rank if key in figures]
            scalars[key] = max(present)
            if key.startswith("gpu/"):
                scalars[f"{key}-min"] = min(present)
        return scalars

    def _write(self, scalars: Mapping[str, float], iteration: int) -> None:
        for writer in self.writers:
            if hasattr(writer, "add_scalar"):
                for tag, value in scalars.items():
                    writer.add_scalar(tag, value, iteration)
            elif hasattr(writer, "log"):
                writer.log(dict(scalars), iteration)
