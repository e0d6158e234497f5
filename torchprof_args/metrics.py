"""One metrics writer, three sinks: wandb, TensorBoard event files and a local metrics.jsonl.

Every rank creates a :class:`MetricsWriter` and calls :meth:`MetricsWriter.log_step` once per
log interval; the readings of all ranks (timers, memory, the profiler's own figures) travel in
one collective, and only the metrics rank (default the last, as in Megatron-LM) writes.  A sink
that cannot start or fails mid-run (wandb not installed, unreachable, crashed) is dropped with
one warning; the others keep going and training never stops because of metrics.

Keys follow Megatron-LM's conventions: ``iteration-time`` (seconds per iteration),
``timers/<name>-time`` (max across ranks, seconds per iteration) and ``timers/<name>-time-min``,
``throughput/samples-per-sec``, ``throughput/tokens-per-sec``, ``throughput/tflops-per-gpu``,
``memory/max-allocated-gb``, ``memory/max-reserved-gb``, ``memory/host-max-rss-gb`` and
``profiler/<figure>`` (max across ranks) with ``profiler/<figure>-min``.  Every series is plotted
against ``iteration``.

This module is import-light: torch, tensorboard and wandb load only when a sink needs them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import netrc
import os
import sys
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from torchprof_args.atomic import write_text_atomically
from torchprof_args.flags import TorchProfileArgsError, resolve_profile_dir
from torchprof_args.log import current_rank, get_logger

__all__ = [
    "MetricsWriter",
    "METRICS_FILENAME",
    "WANDB_RUN_FILENAME",
    "default_wandb_mode",
    "wandb_credentials_present",
    "transformer_flops_per_iteration",
    "validate_timer_args",
    "read_metrics_file",
]

logger = get_logger("torchprof_args.metrics")

METRICS_FILENAME = "metrics.jsonl"
#: Written next to metrics.jsonl by the wandb sink: which wandb run holds these metrics.
WANDB_RUN_FILENAME = "wandb_run.json"
ALL_SINKS = ("wandb", "tensorboard", "jsonl")


# ---------------------------------------------------------------------------------------------
# wandb mode and flag validation


def wandb_credentials_present() -> bool:
    """Whether wandb could log in without asking: ``WANDB_API_KEY`` or a netrc entry."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    netrc_path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(netrc_path).authenticators(host or "api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def default_wandb_mode() -> str:
    """``$WANDB_MODE`` when set, else online with credentials, else offline (sync later)."""
    env = (os.environ.get("WANDB_MODE") or "").lower()
    aliases = {"dryrun": "offline", "run": "online", "disabled": "disabled"}
    if env in ("online", "offline", "disabled") or env in aliases:
        return aliases.get(env, env)
    return "online" if wandb_credentials_present() else "offline"


def _world_size_or_none(world_size: int | None) -> int | None:
    if world_size is not None:
        return world_size
    from torchprof_args.flags import _world_size

    return _world_size()


def validate_timer_args(args: argparse.Namespace, world_size: int | None = None) -> argparse.Namespace:
    """Cross-flag checks of the step-timer and metrics flags (called by ``validate_args``)."""
    metrics_rank = getattr(args, "metrics_rank", None)
    world_size = _world_size_or_none(world_size)
    if metrics_rank is not None and world_size is not None and metrics_rank >= world_size:
        raise TorchProfileArgsError(
            f"--metrics-rank {metrics_rank} is outside the world size {world_size} "
            f"(valid ranks are 0..{world_size - 1})."
        )
    sinks = getattr(args, "metrics_sinks", None) or list(ALL_SINKS)
    mode = getattr(args, "wandb_mode", None)
    if mode in ("online", "offline") and "wandb" not in sinks:
        raise TorchProfileArgsError(
            f"--wandb-mode {mode} needs 'wandb' in --metrics-sinks (now: {' '.join(sinks)})."
        )
    if mode == "online" and not wandb_credentials_present():
        raise TorchProfileArgsError(
            "--wandb-mode online needs wandb credentials: run `wandb login` or set WANDB_API_KEY, "
            "or use --wandb-mode offline and `wandb sync` the run later."
        )
    return args


# ---------------------------------------------------------------------------------------------
# FLOPs


def transformer_flops_per_iteration(
    *,
    num_layers: int,
    hidden_size: int,
    seq_length: int,
    vocab_size: int,
    global_batch_size: int,
    ffn_hidden_size: int | None = None,
    num_attention_heads: int | None = None,
    kv_channels: int | None = None,
    num_query_groups: int | None = None,
    swiglu: bool = False,
) -> float:
    """Model FLOPs of one training iteration (forward + backward) of a GPT-style transformer.

    Counts the matrix multiplications the way Megatron-LM's ``num_floating_point_operations``
    does (dense model): per token and layer the forward pass does ``2*h*(q + 2*kv)`` for the
    Q/K/V projections, ``2*2*s*q`` for scores and their product with V, ``2*q*h`` for the output
    projection and ``2*2*h*f`` for the MLP (x1.5 with SwiGLU's three matrices); the logits add
    ``2*h*vocab`` per token; backward costs twice the forward.
    """
    heads = num_attention_heads or max(1, hidden_size // 64)
    channels = kv_channels or hidden_size // heads
    groups = num_query_groups or heads
    query = heads * channels
    key_value = groups * channels
    ffn = ffn_hidden_size or 4 * hidden_size
    gated = 1.5 if swiglu else 1.0
    per_token_layer = (
        2 * hidden_size * (query + 2 * key_value)
        + 4 * seq_length * query
        + 2 * query * hidden_size
        + 4 * hidden_size * ffn * gated
    )
    per_token = num_layers * per_token_layer + 2 * hidden_size * vocab_size
    return 3.0 * global_batch_size * seq_length * per_token


# ---------------------------------------------------------------------------------------------
# Sinks


class _JsonlSink:
    """One JSON object per logged iteration; each line goes out in one write and is flushed."""

    name = "metrics.jsonl"

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115  (closed in close())

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        record = {"iteration": iteration, "timestamp": time.time(), "metrics": dict(metrics)}
        if per_rank:
            record["per_rank"] = dict(per_rank)
        self._handle.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


class _TensorBoardSink:
    name = "TensorBoard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=30)

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        for tag, value in metrics.items():
            self._writer.add_scalar(tag, value, iteration)

    def close(self) -> None:
        self._writer.close()


class _WandbSink:
    name = "wandb"

    def __init__(
        self,
        *,
        project: str,
        name: str | None,
        entity: str | None,
        save_dir: Path,
        mode: str,
        config: Mapping[str, Any] | None,
        run_file: Path,
    ) -> None:
        import wandb

        self._owns_run = wandb.run is None
        if self._owns_run:
            save_dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=project,
                name=name,
                entity=entity,
                dir=str(save_dir),
                mode=mode,
                config=dict(config or {}),
                settings=wandb.Settings(init_timeout=120, silent=True),
            )
        else:  # the host (Megatron-LM with --wandb-project) already started a run: share it.
            self._run = wandb.run
        self._run.define_metric("iteration")
        self._run.define_metric("*", step_metric="iteration")
        info = {
            "project": self._run.project,
            "entity": getattr(self._run, "entity", None) or entity,
            "id": self._run.id,
            "name": self._run.name,
            "mode": mode,
            "dir": str(getattr(self._run, "dir", "") or ""),
        }
        write_text_atomically(run_file, json.dumps(info, indent=2) + "\n")

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        self._run.log({"iteration": iteration, **metrics})

    def close(self) -> None:
        if self._owns_run:
            self._run.finish()


def _jsonable_config(config: Mapping[str, Any]) -> dict[str, Any]:
    result = {}
    for key, value in config.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            result[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value):
            result[key] = list(value)
        else:
            result[key] = str(value)
    return result


# ---------------------------------------------------------------------------------------------
# Per-rank figures


def _local_memory() -> dict[str, float]:
    figures: dict[str, float] = {}
    try:
        import resource

        # ru_maxrss is KiB on Linux.
        figures["memory/host-max-rss-gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    except (ImportError, OSError):
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        figures["memory/max-allocated-gb"] = torch.cuda.max_memory_allocated() / 2**30
        figures["memory/max-reserved-gb"] = torch.cuda.max_memory_reserved() / 2**30
    return figures


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


# ---------------------------------------------------------------------------------------------
# The writer


class MetricsWriter:
    """Rank-aware writer of step metrics to wandb, TensorBoard and ``metrics.jsonl``.

    Create it on every rank (non-writing ranks get no sinks, only take part in the gathering)
    and call :meth:`log_step` on every rank once per log interval.  It also accepts
    Megatron-style ``add_scalar(tag, value, iteration)`` and wandb-style ``log(dict, step=)``
    calls, so it can be passed as the ``writer`` of ``Timers.write``.
    """

    def __init__(
        self,
        metrics_dir: str | os.PathLike[str],
        *,
        timers: Any = None,
        sinks: Iterable[str] = ALL_SINKS,
        metrics_rank: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        wandb_project: str | None = None,
        wandb_name: str | None = None,
        wandb_entity: str | None = None,
        wandb_dir: str | os.PathLike[str] | None = None,
        wandb_mode: str | None = None,
        config: Mapping[str, Any] | None = None,
        samples_per_iteration: float | None = None,
        tokens_per_iteration: float | None = None,
        flops_per_iteration: float | None = None,
        start_iteration: int = 0,
        console: bool = True,
    ) -> None:
        sinks = [s.lower() for s in sinks]
        unknown = sorted(set(sinks) - set(ALL_SINKS))
        if unknown:
            raise ValueError(f"unknown metrics sinks {unknown}; choose from {', '.join(ALL_SINKS)}.")
        self.metrics_dir = Path(metrics_dir)
        self.timers = timers
        self.rank = current_rank() if rank is None else rank
        if world_size is None:
            dist = sys.modules.get("torch.distributed")
            if dist is not None and dist.is_available() and dist.is_initialized():
                world_size = dist.get_world_size()
            else:
                env = os.environ.get("WORLD_SIZE", "1")
                world_size = int(env) if env.isdigit() else 1
        self.world_size = world_size
        self.metrics_rank = world_size - 1 if metrics_rank is None else metrics_rank
        self.is_writer = self.rank == self.metrics_rank
        self.samples_per_iteration = samples_per_iteration
        self.tokens_per_iteration = tokens_per_iteration
        self.flops_per_iteration = flops_per_iteration
        self.console = console
        self._last_iteration = start_iteration
        self._last_time = time.perf_counter()
        self._pending_iteration: int | None = None
        self._pending: dict[str, float] = {}
        self._sinks: list[Any] = []
        self._warned: set[str] = set()
        self._closed = False
        if self.is_writer:
            self._start_sinks(sinks, wandb_project, wandb_name, wandb_entity, wandb_dir, wandb_mode, config)
        # The first interval is measured from here: create the writer right before the loop.
        self._last_time = time.perf_counter()

    def _start_sinks(
        self,
        sinks: list[str],
        wandb_project: str | None,
        wandb_name: str | None,
        wandb_entity: str | None,
        wandb_dir: str | os.PathLike[str] | None,
        wandb_mode: str | None,
        config: Mapping[str, Any] | None,
    ) -> None:
        if "jsonl" in sinks:
            self._start_sink("metrics.jsonl", lambda: _JsonlSink(self.metrics_dir / METRICS_FILENAME))
        if "tensorboard" in sinks:
            self._start_sink("TensorBoard", lambda: _TensorBoardSink(self.metrics_dir))
        mode = (wandb_mode or default_wandb_mode()).lower()
        if "wandb" in sinks and mode != "disabled":
            self._start_sink(
                "wandb",
                lambda: _WandbSink(
                    project=wandb_project or "torchprof",
                    name=wandb_name or None,
                    entity=wandb_entity or None,
                    save_dir=Path(wandb_dir) if wandb_dir else self.metrics_dir,
                    mode=mode,
                    config=_jsonable_config(config or {}),
                    run_file=self.metrics_dir / WANDB_RUN_FILENAME,
                ),
            )

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        *,
        timers: Any = None,
        samples_per_iteration: float | None = None,
        tokens_per_iteration: float | None = None,
        flops_per_iteration: float | None = None,
        **kwargs: Any,
    ) -> MetricsWriter:
        """A writer configured by the flags (Megatron-LM's args namespace works too).

        Samples and tokens per iteration default to Megatron's ``global_batch_size`` and
        ``global_batch_size * seq_length`` when the namespace has them.
        """
        batch = getattr(args, "global_batch_size", None)
        seq_length = getattr(args, "seq_length", None)
        if samples_per_iteration is None and batch:
            samples_per_iteration = batch
        if tokens_per_iteration is None and batch and seq_length:
            tokens_per_iteration = batch * seq_length
        if flops_per_iteration is None:
            flops_per_iteration = getattr(args, "metrics_flops_per_iteration", None)
        options = {
            "timers": timers,
            "sinks": getattr(args, "metrics_sinks", None) or ALL_SINKS,
            "metrics_rank": getattr(args, "metrics_rank", None),
            "wandb_project": getattr(args, "wandb_project", None),
            "wandb_name": getattr(args, "wandb_exp_name", None),
            "wandb_entity": getattr(args, "wandb_entity", None),
            "wandb_dir": getattr(args, "wandb_save_dir", None),
            "wandb_mode": getattr(args, "wandb_mode", None),
            "config": vars(args),
            "samples_per_iteration": samples_per_iteration,
            "tokens_per_iteration": tokens_per_iteration,
            "flops_per_iteration": flops_per_iteration,
            "start_iteration": getattr(args, "iteration", 0) or 0,
        }
        options.update(kwargs)
        metrics_dir = getattr(args, "metrics_dir", None) or resolve_profile_dir(args)
        return cls(metrics_dir, **options)

    # -- sink management ---------------------------------------------------------------------

    @property
    def sink_names(self) -> list[str]:
        """Sinks that are working on this rank (empty on non-writing ranks)."""
        return [sink.name for sink in self._sinks]

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def _start_sink(self, name: str, factory: Any) -> None:
        try:
            self._sinks.append(factory())
        except ImportError as err:
            self._warn_once(name, f"{name} metrics are off: {err}. Install it to get them; the other sinks keep working.")
        except Exception as err:  # noqa: BLE001  (metrics must never stop training)
            self._warn_once(name, f"{name} metrics are off: could not start ({type(err).__name__}: {err}); the other sinks keep working.")

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
        """TensorBoard-style: buffer one scalar; written with the rest of ``iteration``."""
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
        """wandb-style: ``log({tag: value}, step=iteration)``."""
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
        flops: float | None = None,
        extra: Mapping[str, Any] | None = None,
        normalizer: float | None = None,
        reset: bool = True,
        barrier: bool = False,
    ) -> dict[str, float]:
        """Gather this interval's figures from all ranks (one collective) and write them.

        Every rank must call it with the same ``iteration`` (and ``names``, when given).
        ``iteration_time`` is seconds per iteration (default: measured between calls);
        ``samples``/``tokens``/``flops`` are per iteration for the whole job (defaults from the
        constructor); timers are divided by ``normalizer`` (default: iterations since the last
        call) so they read as seconds per iteration; ``extra`` is this rank's own figures (e.g.
        ``prof.stats``).  Returns the metrics written (on every rank).
        """
        now = time.perf_counter()
        iterations = max(1, iteration - self._last_iteration)
        measured = (now - self._last_time) / iterations
        self._last_iteration, self._last_time = iteration, now
        local: dict[str, float] = {"iteration-time": measured if iteration_time is None else float(iteration_time)}
        local.update(_local_memory())
        local.update(_extra_figures(extra))

        if self.timers is not None:
            snapshot = self.timers.gather(names, reset=reset, barrier=barrier, per_rank=local)
            per_rank_local = snapshot.per_rank
            timer_normalizer = float(normalizer) if normalizer else float(iterations)
            from torchprof_args.timers import timer_scalars

            option = getattr(self.timers, "log_option", "minmax")
            timer_metrics = timer_scalars(snapshot.min_max(timer_normalizer), option)
            per_rank: dict[str, list] = {
                f"timers/{name}-time": [
                    None if math.isnan(t) else t / timer_normalizer for t in snapshot.rank_times(name)
                ]
                for name in snapshot.names
            }
        else:
            per_rank_local = _all_gather_objects(local)
            timer_metrics, per_rank = {}, {}

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
            if key.startswith("profiler/"):
                metrics[f"{key}-min"] = min(present)
        metrics.update(timer_metrics)

        step_time = metrics.get("iteration-time")
        samples = self.samples_per_iteration if samples is None else samples
        tokens = self.tokens_per_iteration if tokens is None else tokens
        flops = self.flops_per_iteration if flops is None else flops
        if step_time and step_time > 0:
            if samples:
                metrics["throughput/samples-per-sec"] = samples / step_time
            if tokens:
                metrics["throughput/tokens-per-sec"] = tokens / step_time
            if flops:
                metrics["throughput/tflops-per-gpu"] = flops / step_time / self.world_size / 1e12

        if self.is_writer and not self._closed:
            if self._pending_iteration is not None and self._pending_iteration != iteration:
                self.flush()
            merged = {**self._pending, **metrics} if self._pending_iteration == iteration else metrics
            self._pending_iteration, self._pending = None, {}
            self._emit(iteration, merged, per_rank)
            if self.console:
                logger.info(_console_line(iteration, merged))
        return metrics

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
                self._warn_once(f"{sink.name}-close", f"{sink.name} did not close cleanly ({type(err).__name__}: {err}).")
        self._sinks = []

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _all_gather_objects(local: Any) -> list[Any]:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return [local]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered


def _console_line(iteration: int, metrics: Mapping[str, float]) -> str:
    parts = [f"iteration {iteration}"]
    if "iteration-time" in metrics:
        parts.append(f"iteration-time {metrics['iteration-time'] * 1000:.1f} ms")
    for key, label in (
        ("throughput/samples-per-sec", "samples/s"),
        ("throughput/tokens-per-sec", "tokens/s"),
        ("throughput/tflops-per-gpu", "TFLOP/s/GPU"),
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


def read_metrics_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` sorted by iteration (a later record for the same
    iteration, e.g. after a restart, wins).  A truncated last line (a crash mid-write) is
    skipped; any other bad line is an error naming the file and line."""
    path = Path(path)
    by_iteration: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        lines = handle.readlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            iteration = int(record["iteration"])
        except (ValueError, KeyError, TypeError) as err:
            if number == len(lines) and not line.endswith("\n"):
                continue
            raise ValueError(f"{path}:{number}: not a metrics record ({err}).") from None
        previous = by_iteration.get(iteration)
        if previous is not None:
            merged = dict(previous.get("metrics", {}))
            merged.update(record.get("metrics", {}))
            record["metrics"] = merged
        by_iteration[iteration] = record
    return [by_iteration[i] for i in sorted(by_iteration)]
