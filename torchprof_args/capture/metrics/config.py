"""Configs of the step timers and the metrics writer, and the flags that fill them.

Import-light (no torch, no wandb).  Several flags are Megatron-LM's own (``host_owned``): under
Megatron the host's values are read, never redefined.
"""

from __future__ import annotations

import argparse
import dataclasses
import netrc
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Literal

from torchprof_args.capture.flags import (
    Flag,
    FlagGroup,
    config_field,
    config_values,
    flag_value,
    register_group,
)
from torchprof_args.capture.flags.types import Number, non_negative_int, positive_float, positive_int
from torchprof_args.capture.metrics.straggler_tracker import DEFAULT_STRAGGLER_TIMERS
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.naming import DEFAULT_PROFILE_DIR
from torchprof_args.shared import stragglers

__all__ = ["ALL_SINKS", "DEFAULT_SINKS", "MetricsConfig", "PrometheusConfig", "TimersConfig", "WandbConfig",
           "WandbMode", "default_wandb_mode", "wandb_credentials_present", "wandb_mode"]

ALL_SINKS = ("wandb", "tensorboard", "jsonl", "prometheus")
#: ``--metrics-sinks``' default: Prometheus only when asked for (it opens a port).
DEFAULT_SINKS = ("wandb", "tensorboard", "jsonl")


#: Megatron's timer log level; the straggler warning's ratio (e.g. 1.05), or 0 for no warning.
timing_log_level = Number(int, "0, 1 or 2", lambda n: n in (0, 1, 2))
straggler_threshold = Number(float, "above 1 (times the other ranks' median), or 0 to turn the warning off",
                             lambda n: n == 0 or n > 1)


LOG_LEVEL = Flag("--timing-log-level",
                 "Timers up to this level are measured; higher ones are free no-ops (Megatron-LM's flag).",
                 default=0, type=timing_log_level, metavar="{0,1,2}", host_owned=True)
LOG_OPTION = Flag("--timing-log-option",
                  "How timers are reduced across ranks: max, minmax, or all (Megatron-LM's flag).",
                  default="minmax", choices=("max", "minmax", "all"), host_owned=True)
LOG_INTERVAL = Flag("--log-interval", "Iterations between two metric writes (Megatron-LM's flag).",
                    default=100, type=positive_int, metavar="N", host_owned=True)
SYNCHRONIZE = Flag("--timing-synchronize",
                   "Synchronize the device at every timer start/stop (Megatron's behaviour) instead of "
                   "timing with CUDA events resolved at log time.", default=False, action="store_true")
WANDB_PROJECT = Flag("--wandb-project", "wandb project (Megatron-LM's flag).", default="torchprof",
                     metavar="NAME", host_owned=True)
WANDB_EXP_NAME = Flag("--wandb-exp-name", "wandb run name (Megatron-LM's flag).", metavar="NAME",
                      host_owned=True)
WANDB_ENTITY = Flag("--wandb-entity", "wandb entity (team or user).", metavar="NAME", host_owned=True)
WANDB_SAVE_DIR = Flag("--wandb-save-dir", "Directory for wandb's local run files (Megatron-LM's flag).",
                      metavar="DIR", host_owned=True, default_doc="the metrics directory")
WANDB_MODE = Flag("--wandb-mode",
                  "online uploads live; offline writes locally for a later `wandb sync`; disabled skips "
                  "wandb.", choices=("online", "offline", "disabled"),
                  default_doc="online with wandb credentials, else offline")
METRICS_DIR = Flag("--metrics-dir", "Directory for metrics.jsonl and the TensorBoard event files.",
                   metavar="DIR", default_doc="`--torch-profile-dir`'s default")
METRICS_SINKS = Flag("--metrics-sinks",
                     "Where the metrics writer writes; prometheus serves /metrics on "
                     "--metrics-prometheus-port (not in the default: it opens a port).",
                     default=list(DEFAULT_SINKS),
                     type=str.lower, nargs="+", choices=ALL_SINKS, metavar="SINK")
PROMETHEUS_PORT = Flag("--metrics-prometheus-port",
                       "Port of the Prometheus endpoint (/metrics) served by the metrics rank with "
                       "--metrics-sinks prometheus; 0: any free port (logged).",
                       default=9464, type=non_negative_int, metavar="PORT")
PROMETHEUS_ADDR = Flag("--metrics-prometheus-addr",
                       "Address the Prometheus endpoint binds to: loopback by default (nothing outside the "
                       "node can read it); the node's cluster address, or 0.0.0.0, for a cluster's "
                       "Prometheus to scrape it (the endpoint has no authentication).",
                       default="127.0.0.1", metavar="ADDR")
GOODPUT_WINDOW = Flag("--metrics-goodput-window",
                      "Seconds of the rolling window of the goodput gauges on the Prometheus endpoint "
                      "(torchprof_goodput, torchprof_goodput_lost_seconds{category=...}).",
                      default=3600.0, type=positive_float, metavar="S")
METRICS_RANK = Flag("--metrics-rank",
                    "Global rank that writes the metrics (wandb, TensorBoard, metrics.jsonl); default the "
                    "last rank, as in Megatron-LM.", type=non_negative_int, metavar="R",
                    default_doc="last rank")
STRAGGLER_THRESHOLD = Flag("--straggler-threshold",
                           "Warn (on rank 0) when a rank stays a straggler in a --straggler-timers timer "
                           "(its time at least this many times the median of the other ranks, and 2 ms "
                           "more) for --straggler-intervals log intervals in a row; 0 turns the warning off "
                           "(the per-rank scores are still written).",
                           default=stragglers.STRAGGLER_THRESHOLD, type=straggler_threshold, metavar="X")
STRAGGLER_INTERVALS = Flag("--straggler-intervals",
                           "Log intervals in a row above --straggler-threshold before a rank is reported "
                           "as a straggler.", default=3, type=positive_int, metavar="N")
STRAGGLER_TIMERS = Flag("--straggler-timers",
                        "Timers that get a straggler score per rank (time over the other ranks' median; "
                        "written per rank to metrics.jsonl, the dashboard's heatmap).",
                        default=list(DEFAULT_STRAGGLER_TIMERS), nargs="+", metavar="NAME")
FLOPS_PER_ITERATION = Flag("--metrics-flops-per-iteration",
                           "Model FLOPs of one training iteration (all ranks together), for TFLOP/s per GPU.",
                           type=positive_float, metavar="F")
PEAK_TFLOPS = Flag("--metrics-peak-tflops",
                   "Dense peak TFLOP/s of one GPU, for MFU (`mfu`, percent of this); overrides the "
                   "built-in table of device peaks (A100, H100, H200, GH200, B200, GB200, L40S, MI250X, "
                   "MI300X, MI325X).",
                   type=positive_float, metavar="TFLOPS", default_doc="from the device name")
PEAK_DTYPE = Flag("--metrics-peak-dtype", "Which of the table's dense peaks MFU is measured against.",
                  default="bf16", choices=("bf16", "fp16", "fp8", "tf32"))
GPU_HARDWARE = Flag("--metrics-gpu-hardware",
                    "Per-rank GPU readings through NVML (SM clock, power, temperature, throttle reasons, "
                    "ECC and XID errors) in each log interval; auto: when nvidia-ml-py is installed.",
                    default="auto", choices=("auto", "off"))

TIMER_FLAGS = register_group(FlagGroup(
    title="step timers and metrics",
    description="Megatron-compatible step timers (CUDA events, no device synchronize per start/stop) "
                "written to wandb, TensorBoard and a local metrics.jsonl (torchprof-args).",
    flags=(LOG_LEVEL, LOG_OPTION, LOG_INTERVAL, SYNCHRONIZE, WANDB_PROJECT, WANDB_EXP_NAME, WANDB_ENTITY,
           WANDB_SAVE_DIR, WANDB_MODE, METRICS_DIR, METRICS_SINKS, PROMETHEUS_PORT, PROMETHEUS_ADDR,
           GOODPUT_WINDOW, METRICS_RANK, FLOPS_PER_ITERATION,
           PEAK_TFLOPS, PEAK_DTYPE, GPU_HARDWARE,
           STRAGGLER_THRESHOLD, STRAGGLER_INTERVALS, STRAGGLER_TIMERS),
    order=30,
))


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


#: How the wandb sink runs (``--wandb-mode``).
WandbMode = Literal["online", "offline", "disabled"]
#: Each mode by its names, wandb's old aliases included.
_WANDB_MODES: dict[str, WandbMode] = {"online": "online", "offline": "offline", "disabled": "disabled",
                                      "dryrun": "offline", "run": "online"}


def default_wandb_mode() -> WandbMode:
    """``$WANDB_MODE`` when set, else online with credentials, else offline (sync later)."""
    mode = _WANDB_MODES.get((os.environ.get("WANDB_MODE") or "").lower())
    if mode is not None:
        return mode
    return "online" if wandb_credentials_present() else "offline"


def wandb_mode(config: WandbConfig) -> WandbMode:
    """The mode the wandb sink runs in: ``config.mode`` (any case, or an alias), else the default."""
    if config.mode is None:
        return default_wandb_mode()
    mode = _WANDB_MODES.get(config.mode.lower())
    if mode is None:
        raise ValueError(f"wandb mode must be online, offline or disabled, got {config.mode!r}")
    return mode


@dataclasses.dataclass(frozen=True)
class TimersConfig:
    """How :class:`~torchprof_args.capture.metrics.timers.Timers` measure (Megatron's flags plus ours)."""

    log_level: int = config_field(LOG_LEVEL)
    log_option: str = config_field(LOG_OPTION)
    synchronize: bool = config_field(SYNCHRONIZE)
    #: Timers are NVTX ranges too (``--torch-profile-nsys``).
    nvtx: bool = False
    #: ``--straggler-threshold`` (0: no warning), ``--straggler-intervals``, ``--straggler-timers``.
    straggler_threshold: float = config_field(STRAGGLER_THRESHOLD)
    straggler_intervals: int = config_field(STRAGGLER_INTERVALS)
    straggler_timers: tuple[str, ...] = tuple(STRAGGLER_TIMERS.default)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, *, nvtx: bool) -> TimersConfig:
        return cls(**config_values(cls, args), nvtx=nvtx,
                   straggler_timers=tuple(flag_value(args, STRAGGLER_TIMERS)))


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    project: str = WANDB_PROJECT.default
    name: str | None = WANDB_EXP_NAME.default
    entity: str | None = WANDB_ENTITY.default
    save_dir: str | None = WANDB_SAVE_DIR.default  # None: the metrics directory
    mode: str | None = WANDB_MODE.default  # None: default_wandb_mode() when the sink starts


@dataclasses.dataclass(frozen=True)
class PrometheusConfig:
    """The Prometheus endpoint (``--metrics-sinks prometheus``): where it listens, the goodput window."""

    port: int = config_field(PROMETHEUS_PORT)
    addr: str = config_field(PROMETHEUS_ADDR)
    goodput_window: float = config_field(GOODPUT_WINDOW)


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where and how :class:`~torchprof_args.capture.metrics.writer.MetricsWriter` writes.

    ``samples_per_iteration``/``tokens_per_iteration`` default to Megatron's
    ``global_batch_size`` (x ``seq_length``) when the namespace has them; ``run_settings`` is the
    namespace as JSON-able values, for wandb's run config.
    """

    metrics_dir: str = DEFAULT_PROFILE_DIR
    sinks: tuple[str, ...] = DEFAULT_SINKS
    metrics_rank: int | None = config_field(METRICS_RANK)  # None: the last rank
    wandb: WandbConfig = WandbConfig()
    prometheus: PrometheusConfig = PrometheusConfig()
    log_interval: int = config_field(LOG_INTERVAL)
    samples_per_iteration: float | None = None
    tokens_per_iteration: float | None = None
    #: a number, or (Python API) a callable of the iteration
    flops_per_iteration: float | Callable[[int], float] | None = config_field(FLOPS_PER_ITERATION)
    #: ``--metrics-peak-tflops`` (None: from the device table), ``--metrics-peak-dtype``
    peak_tflops: float | None = config_field(PEAK_TFLOPS)
    peak_dtype: str = config_field(PEAK_DTYPE)
    #: ``--metrics-gpu-hardware``: NVML readings per rank (False: off)
    gpu_hardware: bool = True
    run_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def from_namespace(
        cls, args: argparse.Namespace, *, profile_dir: str, world_size: int | None
    ) -> MetricsConfig:
        values = config_values(cls, args)
        metrics_rank = values["metrics_rank"]
        if metrics_rank is not None and world_size is not None and metrics_rank >= world_size:
            raise TorchProfileArgsError(
                f"--metrics-rank {metrics_rank} is outside the world size {world_size} "
                f"(valid ranks are 0..{world_size - 1}).")
        sinks = tuple(flag_value(args, METRICS_SINKS))
        wandb = _wandb_config(args, sinks)
        batch, seq_length = getattr(args, "global_batch_size", None), getattr(args, "seq_length", None)
        return cls(**values, metrics_dir=flag_value(args, METRICS_DIR) or profile_dir, sinks=sinks,
                   wandb=wandb, prometheus=_prometheus_config(args),
                   samples_per_iteration=batch or None,
                   tokens_per_iteration=batch * seq_length if batch and seq_length else None,
                   gpu_hardware=flag_value(args, GPU_HARDWARE) != "off",
                   run_settings=jsonable(vars(args)))


def _prometheus_config(args: argparse.Namespace) -> PrometheusConfig:
    return PrometheusConfig(**config_values(PrometheusConfig, args))


def _wandb_config(args: argparse.Namespace, sinks: tuple[str, ...]) -> WandbConfig:
    mode = flag_value(args, WANDB_MODE)
    if mode in ("online", "offline") and "wandb" not in sinks:
        raise TorchProfileArgsError(
            f"--wandb-mode {mode} needs 'wandb' in --metrics-sinks (now: {' '.join(sinks)}).")
    if mode == "online" and not wandb_credentials_present():
        raise TorchProfileArgsError(
            "--wandb-mode online needs wandb credentials: run `wandb login` or set WANDB_API_KEY, or use "
            "--wandb-mode offline and `wandb sync` the run later.")
    return WandbConfig(project=flag_value(args, WANDB_PROJECT) or WANDB_PROJECT.default,
                       name=flag_value(args, WANDB_EXP_NAME) or None,
                       entity=flag_value(args, WANDB_ENTITY) or None,
                       save_dir=flag_value(args, WANDB_SAVE_DIR) or None,
                       mode=mode)


def jsonable(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every value a JSON scalar or list of scalars (others as ``str``); private
    (underscore) keys dropped."""
    result: dict[str, Any] = {}
    for key, value in settings.items():
        if key.startswith("_"):
            continue
        if isinstance(value, (str, int, float, bool)) or value is None:
            result[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value):
            result[key] = list(value)
        else:
            result[key] = str(value)
    return result
