"""One metrics writer, three sinks: wandb, TensorBoard event files and a local metrics.jsonl.

Every rank creates a :class:`MetricsWriter` and calls :meth:`MetricsWriter.log_step` once per
log interval; the readings of all ranks (timers, memory, the profiler's own figures) travel in
one fixed-size collective (:mod:`~torchprof_args.capture.metrics.gather`), and only the metrics rank
(default the last, as in Megatron-LM) writes.  A sink that cannot start or fails mid-run (wandb
not installed, unreachable, crashed) is dropped with one warning; the others keep going and
training never stops because of metrics.

Keys follow Megatron-LM's conventions: ``iteration-time`` (seconds per iteration),
``timers/<name>-time`` (max across ranks, seconds per iteration) and ``timers/<name>-time-min``,
``throughput/samples-per-sec``, ``throughput/tokens-per-sec``, ``throughput`` (TFLOP/s per GPU, as
Megatron-LM) and ``mfu`` (:mod:`~torchprof_args.capture.metrics.mfu`), the allocator and ``gpu/`` readings
of :mod:`~torchprof_args.capture.metrics.hardware` (max across ranks, ``gpu/<figure>-min`` too),
``memory/host-max-rss-gb`` and
``profiler/<figure>`` (max across ranks) with ``profiler/<figure>-min``; with several ranks also
``timers/<name>-time-max-rank`` (the slowest rank) and the straggler scores' maximum
``stragglers/<name>-score-max`` (and ``-score-max-rank``), whose per-rank values go to
``metrics.jsonl`` (:mod:`~torchprof_args.capture.metrics.straggler_tracker`).  Every series is plotted against
``iteration``.

This module is import-light: torch, tensorboard and wandb load only when a sink needs them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args import _dist
from torchprof_args.capture.metrics.config import ALL_SINKS, MetricsConfig, wandb_mode
from torchprof_args.capture.metrics.gather import RankGather, Request
from torchprof_args.capture.metrics.hardware import DeviceReadings
from torchprof_args.capture.metrics.health import AllocRetryWatch
from torchprof_args.capture.metrics.mfu import PeakResolver, flops_value, rate_figures, throughput_figures
from torchprof_args.capture.metrics.sinks import JsonlSink, Sink, TensorBoardSink, WandbSink
from torchprof_args.log import get_logger
from torchprof_args.naming import METRICS_FILENAME, WANDB_RUN_FILENAME
from torchprof_args.shared.metrics_log import RunMarker

if TYPE_CHECKING:
    from torchprof_args.capture.metrics.timers import Timers

__all__ = ["MetricsWriter"]

logger = get_logger(__name__)
#: One rank's figures by key.
_Figures = dict[str, float]

# ---------------------------------------------------------------------------------------------
# Per-rank figures


def _host_memory() -> dict[str, float]:
    try:
        import resource

        # ru_maxrss is KiB on Linux.
        return {"memory/host-max-rss-gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    except (ImportError, OSError):
        return {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    item = getattr(value, "item", None)  # 0-d tensors / numpy scalars
    if item is not None:
        try:
            return _number(item())
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def _extra_figures(extra: Mapping[str, Any] | None) -> dict[str, float]:
    figures: dict[str, float] = {}
    for key, value in (extra or {}).items():
        number = _number(value)
        if number is not None:
            figures[key if "/" in key else f"profiler/{key}"] = number
    return figures


class MetricsWriter:
    """Rank-aware writer of step metrics to wandb, TensorBoard and ``metrics.jsonl``: create it on every
    rank (non-writing ranks get no sinks, only take part in the gathering), call :meth:`log_step` on
    every rank once per log interval; Megatron's ``add_scalar`` and wandb's ``log`` work too.

    Args:
        config: a :class:`~torchprof_args.capture.metrics.config.MetricsConfig`, or just the
            metrics directory.
        timers: read in the same collective; ``rank``, ``world_size``, ``start_iteration``, ``console``.
    """

    def __init__(self, config: MetricsConfig | str | os.PathLike[str], *, timers: Timers | None = None,
                 rank: int | None = None, world_size: int | None = None, start_iteration: int = 0,
                 console: bool = True) -> None:
        if not isinstance(config, MetricsConfig):
            config = MetricsConfig(metrics_dir=str(config))
        unknown = sorted(set(config.sinks) - set(ALL_SINKS))
        if unknown:
            raise ValueError(f"unknown metrics sinks {unknown}; choose from {', '.join(ALL_SINKS)}.")
        self.config = config
        self.metrics_dir = Path(config.metrics_dir)
        self.timers = timers
        self.rank = _dist.rank() if rank is None else rank
        self.world_size = _dist.world_size() if world_size is None else world_size
        self.metrics_rank = self.world_size - 1 if config.metrics_rank is None else config.metrics_rank
        self.is_writer = self.rank == self.metrics_rank
        self.console = console
        self._last_iteration = start_iteration
        self._pending_iteration: int | None = None
        self._pending: dict[str, float] = {}
        self._sinks: list[Sink] = []
        self._warned: set[str] = set()
        self._closed = False
        self._figures_gather: RankGather | None = None
        #: this rank's allocator and NVML readings; the peak for MFU; the allocation-retry warning
        self.readings = DeviceReadings(hardware=config.gpu_hardware)
        self.peak = PeakResolver(config.peak_tflops, config.peak_dtype)
        self.alloc_retries = AllocRetryWatch(rank=self.rank)
        #: this process's run in metrics.jsonl (shared/metrics_log.py): the first interval is measured
        #: from here, so create the writer right before the loop (after loading a checkpoint)
        self.run = RunMarker.here(start_iteration, self.world_size)
        if self.is_writer:
            self._start_sinks()
        self._last_time = time.perf_counter()

    def _start_sinks(self) -> None:
        config, wandb = self.config, self.config.wandb
        if "jsonl" in config.sinks:
            path = self.metrics_dir / METRICS_FILENAME
            self._start_sink("metrics.jsonl", lambda: JsonlSink(path, self.run))
        if "prometheus" in config.sinks:
            from torchprof_args.capture.metrics.prometheus import PrometheusSink

            self._start_sink("Prometheus", lambda: PrometheusSink(config.prometheus, self.run))
        if "tensorboard" in config.sinks:
            self._start_sink("TensorBoard", lambda: TensorBoardSink(self.metrics_dir))
        mode = wandb_mode(wandb)
        if "wandb" in config.sinks and mode != "disabled":
            self._start_sink("wandb", lambda: WandbSink(
                project=wandb.project, name=wandb.name, entity=wandb.entity,
                save_dir=Path(wandb.save_dir) if wandb.save_dir else self.metrics_dir, mode=mode,
                config=dict(config.run_settings), run_file=self.metrics_dir / WANDB_RUN_FILENAME))

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, timers: Timers | None = None,
                  samples_per_iteration: float | None = None, tokens_per_iteration: float | None = None,
                  flops_per_iteration: float | None = None, **kwargs: Any) -> MetricsWriter:
        """A writer configured by the flags (Megatron-LM's args namespace works too; checked here).

        Args:
            args: the parsed namespace; ``timers``, ``kwargs``: the constructor's.  Samples and tokens
                per iteration default to Megatron's ``global_batch_size`` (x ``seq_length``) if given.

        Returns:
            The writer.
        """
        from torchprof_args.capture.config import configs_from_args

        run = configs_from_args(args, world_size=kwargs.get("world_size"))
        given = {"samples_per_iteration": samples_per_iteration, "tokens_per_iteration": tokens_per_iteration,
                 "flops_per_iteration": flops_per_iteration}  # MetricsConfig's fields of the same names
        overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
        kwargs.setdefault("start_iteration", run.start_iteration)
        return cls(dataclasses.replace(run.metrics, **overrides), timers=timers, **kwargs)

    # -- sink management ---------------------------------------------------------------------

    @property
    def sink_names(self) -> list[str]:
        """Sinks that are working on this rank (empty on non-writing ranks)."""
        return [sink.name for sink in self._sinks]

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def _start_sink(self, name: str, factory: Callable[[], Sink]) -> None:
        try:
            self._sinks.append(factory())
        except ImportError as err:
            self._warn_once(name, f"{name} metrics are off: {err}. Install it to get them; the other "
                                  "sinks keep working.")
        except Exception as err:  # noqa: BLE001  (metrics must never stop training)
            self._warn_once(name, f"{name} metrics are off: could not start ({type(err).__name__}: "
                                  f"{err}); the other sinks keep working.")

    def _emit(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        for sink in list(self._sinks):
            try:
                sink.write(iteration, metrics, per_rank)
            except Exception as err:  # noqa: BLE001  (metrics must never stop training)
                self._sinks.remove(sink)
                self._warn_once(
                    sink.name,
                    f"{sink.name} metrics stopped at iteration {iteration} ({type(err).__name__}: {err}); "
                    "the other sinks keep working.",
                )
                with contextlib.suppress(Exception):
                    sink.close()

    # -- Megatron / wandb style entry points ---------------------------------------------------

    def add_scalar(self, tag: str, value: float, iteration: int) -> None:
        """TensorBoard-style: buffer ``value`` under ``tag``, written with the rest of ``iteration``."""
        if not self.is_writer or self._closed:
            return
        number = _number(value)
        if number is None:
            return
        if self._pending_iteration is not None and iteration != self._pending_iteration:
            self.flush()
        self._pending_iteration = iteration
        self._pending[tag] = number

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """wandb-style: ``log({tag: value}, step=iteration)`` (default: the step buffered, else the last)."""
        if step is None:
            step = metrics.get("iteration", self._pending_iteration or self._last_iteration)
        for tag, value in metrics.items():
            if tag != "iteration":
                self.add_scalar(tag, value, int(step))

    def flush(self) -> None:
        """Write the scalars buffered by ``add_scalar`` for their iteration."""
        if self._pending_iteration is not None and self._pending:
            self._emit(self._pending_iteration, dict(self._pending), {})
        self._pending_iteration = None
        self._pending = {}

    # -- one call per log interval -----------------------------------------------------------

    def log_step(
        self,
        iteration: int,
        *,
        names: Iterable[str] | None = None,
        iteration_time: float | None = None,
        samples: float | None = None,
        tokens: float | None = None,
        flops: float | Callable[[int], float] | None = None,
        extra: Mapping[str, Any] | None = None,
        normalizer: float | None = None,
        reset: bool = True,
        barrier: bool = False,
    ) -> dict[str, float]:
        """Gather this interval's figures from all ranks (one collective) and write them.

        Args:
            iteration: the same on every rank (``names``, the timers, too, when given).
            iteration_time: seconds per iteration (default: measured between calls); ``samples``,
                ``tokens``, ``flops``: per iteration for the whole job (default: the config's; ``flops``
                may be a callable of the iteration); ``extra``: this rank's own figures (``prof.stats``).
            normalizer: timers are divided by it to read as seconds per iteration (default: iterations
                since the last call); ``reset``, ``barrier``: as ``Timers.gather``'s.

        Returns:
            The metrics written (on every rank).
        """
        now = time.perf_counter()
        iterations = max(1, iteration - self._last_iteration)
        measured = (now - self._last_time) / iterations
        self._last_iteration, self._last_time = iteration, now
        local: dict[str, float] = {
            "iteration-time": measured if iteration_time is None else float(iteration_time)
        }
        local.update(_host_memory())
        local.update(self.readings.read())
        local.update(_extra_figures(extra))
        timer_normalizer = float(normalizer) if normalizer else float(iterations)
        per_rank_local, timer_metrics, per_rank = self._gather(local, names, timer_normalizer, reset, barrier,
                                                               iteration)
        metrics = _reduce_across_ranks(per_rank_local, per_rank)
        metrics.update(timer_metrics)
        self.alloc_retries.update(iteration, per_rank_local)
        config = self.config
        step_time = metrics.get("iteration-time")
        metrics.update(rate_figures(
            step_time, samples=config.samples_per_iteration if samples is None else samples,
            tokens=config.tokens_per_iteration if tokens is None else tokens))
        flops_per_iteration = (flops_value(config.flops_per_iteration if flops is None else flops, iteration)
                               or metrics.get("throughput/model-flops-per-iteration"))  # DeepSpeed's profiler
        if flops_per_iteration:
            metrics.update(throughput_figures(step_time, self.world_size, flops_per_iteration, self.peak))
        if self.is_writer and not self._closed:
            if self._pending_iteration is not None and self._pending_iteration != iteration:
                self.flush()
            merged = {**self._pending, **metrics} if self._pending_iteration == iteration else metrics
            self._pending_iteration, self._pending = None, {}
            self._emit(iteration, merged, per_rank)
            if self.console:
                logger.info(_console_line(iteration, merged))
        return metrics

    def _gather(self, local: dict[str, float], names: Iterable[str] | None, normalizer: float, reset: bool,
                barrier: bool, iteration: int) -> tuple[list[_Figures], _Figures, dict[str, list]]:
        """Every rank's figures (one fixed-size collective, riding on the timers' gather when there
        are timers), the timer and straggler scalars, and the per-rank series (each timer's seconds
        per iteration, the straggler scores)."""
        if self.timers is None:
            if self._figures_gather is None:
                self._figures_gather = RankGather()
            return _gather_figures(self._figures_gather, local), {}, {}
        snapshot = self.timers.gather(names, reset=reset, barrier=barrier, per_rank=local)
        scalars, scores = self.timers.interval_figures(snapshot, normalizer, iteration)
        per_rank: dict[str, list] = {
            f"timers/{name}-time": [
                None if math.isnan(t) else t / normalizer for t in snapshot.rank_times(name)
            ]
            for name in snapshot.names}
        per_rank.update(scores)
        return [figures or {} for figures in snapshot.per_rank], scalars, per_rank

    def close(self) -> None:
        """Flush and close every sink (wandb finishes its run if this writer started it)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        for sink in self._sinks:
            try:
                sink.close()
            except Exception as err:  # noqa: BLE001
                self._warn_once(f"{sink.name}-close",
                                f"{sink.name} did not close cleanly ({type(err).__name__}: {err}).")
        self._sinks = []

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _gather_figures(gather: RankGather, local: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's figures through ``gather`` (a :class:`~.gather.RankGather`)."""
    figures = {key: value for key, value in local.items() if math.isfinite(value)}
    agreement, rows = gather.gather(Request((), False, tuple(figures)), {}, figures)
    return [{key: value for key, value in zip(agreement.figures, row, strict=True) if not math.isnan(value)}
            for row in rows]


def _reduce_across_ranks(per_rank_local: list[_Figures], per_rank: dict[str, list]) -> _Figures:
    """Max across ranks of every figure (and min of the profiler's); fills ``per_rank`` by key."""
    metrics: dict[str, float] = {}
    keys: list[str] = []
    for figures in per_rank_local:
        keys += [k for k in figures if k not in keys]
    for key in keys:
        values = [figures.get(key) for figures in per_rank_local]
        per_rank[key] = values
        present = [v for v in values if v is not None]
        if not present:
            continue
        metrics[key] = max(present)
        if key.startswith(("profiler/", "gpu/")):
            metrics[f"{key}-min"] = min(present)
    return metrics


def _console_line(iteration: int, metrics: Mapping[str, float]) -> str:
    parts = [f"iteration {iteration}"]
    if "iteration-time" in metrics:
        parts.append(f"iteration-time {metrics['iteration-time'] * 1000:.1f} ms")
    for key, label in (
        ("throughput/samples-per-sec", "samples/s"),
        ("throughput/tokens-per-sec", "tokens/s"),
        ("throughput", "TFLOP/s/GPU"),
        ("mfu", "MFU %"),
    ):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.4g}")
    timers = [
        f"{key[len('timers/'):-len('-time')]} {value * 1000:.1f}"
        for key, value in metrics.items()
        if key.startswith("timers/") and key.endswith("-time")
    ]
    if timers:
        parts.append("max ms/iter: " + ", ".join(timers))
    return " | ".join(parts)
