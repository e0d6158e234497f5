"""The runtime's configs (traces, export, memory snapshots, nsys, flight recorder), filled from
the flags of :mod:`torchprof_args.capture.runtime.flags`.

Import-light (no torch): :mod:`torchprof_args.capture.config` turns a parsed namespace into the frozen
configs below; nothing under ``runtime/`` ever reads the namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Protocol, TypedDict

from torchprof_args import _dist
from torchprof_args.capture.flags import config_field, config_values, flag_value, was_given
from torchprof_args.capture.ondemand.config import OnDemandConfig
from torchprof_args.capture.runtime import flags
from torchprof_args.capture.runtime.flags import PARALLEL_AXES, parallel_selector, profile_dir
from torchprof_args.capture.runtime.schedule import ProfileSchedule
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.log import get_logger
from torchprof_args.naming import (
    DEBUG_SERVER_SUBDIR,
    DEFAULT_PROFILE_DIR,
    FLIGHT_RECORDER_SUBDIR,
    MEMORY_SNAPSHOT_SUBDIR,
    STACKS_CONTROL_SUBDIR,
)
from torchprof_args.torch_support import WITH_MODULES_DEPRECATED, torch_at_least

logger = get_logger(__name__)

__all__ = [
    "DebugServerConfig",
    "ExportConfig",
    "FlightRecorderConfig",
    "MemorySnapshotConfig",
    "NsysConfig",
    "PARALLEL_AXES",
    "ProfilerConfig",
    "ProfiledRun",
    "ProfilerOptions",
    "TraceConfig",
    "parallel_selector",
    "profile_dir",
]


class ProfilerOptions(TypedDict):
    """:meth:`TraceConfig.profiler_options`: what ``torch.profiler.profile`` records besides activities."""

    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    with_flops: bool
    with_modules: bool


#: ``(axis, indices)`` pairs of ``--torch-profile-parallel-ranks``.
ParallelSelectors = tuple[tuple[str, tuple[int, ...]], ...]


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """What torch.profiler records, on which ranks, by which schedule, and where traces go.

    ``ranks`` (None: every rank) also selects the ranks that take memory snapshots;
    ``parallel_ranks``, when given, replaces ``ranks`` once the ranks' coordinates are known.
    """

    enabled: bool = config_field(flags.TORCH_PROFILE)
    ranks: tuple[int, ...] | None = tuple(flags.RANKS.default)
    parallel_ranks: ParallelSelectors = ()
    schedule: ProfileSchedule = ProfileSchedule()
    activities: tuple[str, ...] = ()
    record_shapes: bool = config_field(flags.RECORD_SHAPES)
    profile_memory: bool = config_field(flags.PROFILE_MEMORY)
    with_stack: bool = config_field(flags.WITH_STACK)
    with_flops: bool = config_field(flags.WITH_FLOPS)
    with_modules: bool = config_field(flags.WITH_MODULES)
    #: ``--torch-profile-compiled-modules``: inductor's kernel -> module map beside the traces.
    compiled_modules: bool = config_field(flags.COMPILED_MODULES)
    execution_trace: bool = config_field(flags.EXECUTION_TRACE)
    #: ``--torch-profile-memory-categories``: the windows whose exporter runs PyTorch's memory
    #: categorisation ("first" of each rank, "every", "off").
    memory_categories: str = config_field(flags.MEMORY_CATEGORIES)
    output_dir: str = DEFAULT_PROFILE_DIR
    #: ``with_modules`` asked on a torch where it does nothing in eager mode (2.14+): the module
    #: hierarchy is recorded through ``with_stack`` instead (its ``nn.Module`` events).
    modules_via_stack: bool = False

    def profiler_options(self) -> ProfilerOptions:
        """Keyword arguments of ``torch.profiler.profile`` besides activities and schedule."""
        via_stack = self.modules_via_stack
        return ProfilerOptions(record_shapes=self.record_shapes, profile_memory=self.profile_memory,
                               with_stack=self.with_stack or via_stack, with_flops=self.with_flops,
                               with_modules=self.with_modules and not via_stack)

    def selects(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> TraceConfig:
        ranks = list(flag_value(args, flags.RANKS))
        if "all" in ranks and len(ranks) > 1:
            raise TorchProfileArgsError("--torch-profile-ranks: give either 'all' or rank numbers, not both.")
        values = config_values(cls, args)
        categories = values["memory_categories"]
        needed = (flags.PROFILE_MEMORY, flags.RECORD_SHAPES, flags.WITH_STACK)
        missing = [flag.option for flag in needed if not flag_value(args, flag)]
        if was_given(args, flags.MEMORY_CATEGORIES) and categories != "off" and missing:
            raise TorchProfileArgsError(f"--torch-profile-memory-categories {categories} needs "
                                        f"{', '.join(missing)}: add them, or drop it.")
        return cls(
            **values,
            ranks=None if "all" in ranks else tuple(sorted(set(ranks))),
            parallel_ranks=tuple(flag_value(args, flags.PARALLEL_RANKS) or ()),
            schedule=_schedule(args),
            activities=tuple(flag_value(args, flags.ACTIVITIES) or ()),
            output_dir=profile_dir(args),
            modules_via_stack=values["with_modules"] and torch_at_least(WITH_MODULES_DEPRECATED),
        )


def _schedule(args: argparse.Namespace) -> ProfileSchedule:
    """The schedule, after the checks that tie its flags together."""
    start, end = flag_value(args, flags.STEP_START), flag_value(args, flags.STEP_END)
    active = flag_value(args, flags.ACTIVE)
    if start is not None or end is not None:
        if start is None:
            raise TorchProfileArgsError("--torch-profile-step-end needs --torch-profile-step-start.")
        relative = (flags.WAIT, flags.SKIP_FIRST, flags.REPEAT)
        given = [flag.option for flag in relative if was_given(args, flag)]
        if given:
            raise TorchProfileArgsError(
                f"--torch-profile-step-start/-end cannot be combined with {', '.join(given)}: choose "
                "absolute iterations or a relative schedule.")
        if end is not None and was_given(args, flags.ACTIVE):
            raise TorchProfileArgsError("--torch-profile-active cannot be combined with "
                                        "--torch-profile-step-end (the window is step-end - step-start).")
        if end is not None and end <= start:
            raise TorchProfileArgsError(f"--torch-profile-step-end ({end}) must be greater than "
                                        f"--torch-profile-step-start ({start}).")
        end = start + active if end is None else end
        active = end - start
    return ProfileSchedule(wait=flag_value(args, flags.WAIT), warmup=flag_value(args, flags.WARMUP),
                           active=active, repeat=flag_value(args, flags.REPEAT),
                           skip_first=flag_value(args, flags.SKIP_FIRST), step_start=start, step_end=end)


_DEPRECATED_SEEN: set[str] = set()


def _deprecated_once(flag: str, why: str) -> None:
    """Warn once per process that ``flag`` is deprecated and does nothing (``why``)."""
    if flag not in _DEPRECATED_SEEN:
        _DEPRECATED_SEEN.add(flag)
        logger.warning("rank %d: %s is deprecated and does nothing: %s; remove it from the launch "
                       "command", _dist.rank(), flag, why)


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """How a stopped trace reaches the output directory (see :mod:`torchprof_args.capture.runtime.export`),
    and the job-safety budgets: fence timeout, exit wait, SIGTERM grace, host memory reserve."""

    mode: str = config_field(flags.EXPORT)
    staging_dir: str | None = config_field(flags.STAGING_DIR)
    gzip_level: int | None = flags.GZIP_LEVEL.default  # None: published uncompressed
    #: None: no operator table (nor summary sidecar) per trace
    operator_table_rows: int | None = flags.OPERATOR_TABLE_ROWS.default
    flush_timeout: float = config_field(flags.FLUSH_TIMEOUT)
    exit_timeout: float = config_field(flags.EXIT_TIMEOUT)
    term_grace: float = config_field(flags.TERM_GRACE)
    min_free_host_mb: int = config_field(flags.MIN_FREE_HOST_MB)
    #: Publications in flight on a rank at which the next window is skipped on every rank (0: no bound).
    max_publishing: int = config_field(flags.MAX_PUBLISHING)
    #: ``--torch-profile-publisher-priority``: the exporter and publisher at the lowest CPU and I/O
    #: priority ("idle", :mod:`~torchprof_args.capture.runtime.export.priority`) or the trainer's ("normal").
    publisher_priority: str = config_field(flags.PUBLISHER_PRIORITY)
    #: ``--torch-profile-publish-wait``: the flush step waits for its publication ("auto": when the
    #: node's CPUs were busy, :mod:`~torchprof_args.capture.runtime.export.idle_cpu`), at most
    #: ``publish_wait_timeout`` seconds.
    publish_wait: str = config_field(flags.PUBLISH_WAIT)
    publish_wait_timeout: float = config_field(flags.PUBLISH_WAIT_TIMEOUT)
    #: ``--torch-profile-analysis-budget``: the analyses published with a trace may take this share
    #: of its export time (:meth:`~torchprof_args.capture.runtime.export.job.PublishJob.analysis_seconds`);
    #: 0: no budget.
    analysis_budget: float = config_field(flags.ANALYSIS_BUDGET)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> ExportConfig:
        config = cls(
            **config_values(cls, args),
            gzip_level=flag_value(args, flags.GZIP_LEVEL) if flag_value(args, flags.GZIP) else None,
            operator_table_rows=(flag_value(args, flags.OPERATOR_TABLE_ROWS)
                                 if flag_value(args, flags.OPERATOR_TABLE) else None),
        )
        if was_given(args, flags.PUBLISHER_SERVER):
            _deprecated_once(flags.PUBLISHER_SERVER.option, "each traced rank always has one long-lived "
                             "publisher process now")
        if config.exit_timeout >= config.flush_timeout:
            raise TorchProfileArgsError(
                f"--torch-profile-exit-timeout ({config.exit_timeout:g} s) must be shorter than "
                f"--torch-profile-flush-timeout ({config.flush_timeout:g} s): at exit every rank waits at "
                "the fence while the slowest rank waits for its publishers.")
        if config.publish_wait_timeout >= config.flush_timeout:
            raise TorchProfileArgsError(
                f"--torch-profile-publish-wait-timeout ({config.publish_wait_timeout:g} s) must be shorter "
                f"than --torch-profile-flush-timeout ({config.flush_timeout:g} s): the other ranks wait at "
                "the fence meanwhile.")
        return config


@dataclasses.dataclass(frozen=True)
class MemorySnapshotConfig:
    """CUDA allocator history and the snapshots dumped from it (on the traced ranks)."""

    enabled: bool = config_field(flags.MEMORY_SNAPSHOT)
    max_entries: int = config_field(flags.MEMORY_MAX_ENTRIES)
    stacks: str = config_field(flags.MEMORY_STACKS)
    interval: int = config_field(flags.MEMORY_INTERVAL)
    output_dir: str = f"{DEFAULT_PROFILE_DIR}/{MEMORY_SNAPSHOT_SUBDIR}"

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> MemorySnapshotConfig:
        values = config_values(cls, args)
        options = (flags.MEMORY_MAX_ENTRIES, flags.MEMORY_STACKS, flags.MEMORY_INTERVAL)
        given = [flag.option for flag in options if was_given(args, flag)]
        if given and not values["enabled"]:
            raise TorchProfileArgsError(f"{', '.join(given)} only take effect with "
                                        "--torch-profile-memory-snapshot; add it or drop them.")
        return cls(**values, output_dir=f"{profile_dir(args)}/{MEMORY_SNAPSHOT_SUBDIR}")


@dataclasses.dataclass(frozen=True)
class NsysConfig:
    """Nsight Systems capture range around the recorded steps, NVTX ranges for steps and timers."""

    enabled: bool = config_field(flags.NSYS)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> NsysConfig:
        return cls(**config_values(cls, args))


@dataclasses.dataclass(frozen=True)
class FlightRecorderConfig:
    """Hang forensics: PyTorch's flight recorder (``--torch-profile-flight-recorder``: entries per
    process group, 0: off), every rank's stacks dumped at a hang (``--torch-profile-stacks``,
    implied by the recorder), where the dumps go, and the stacks server that answers ``torchprof
    trigger --stacks`` (``--torch-profile-stacks-server``, on wherever the profiler runs) with its
    control directory."""

    entries: int = 0  # --torch-profile-flight-recorder unset
    output_dir: str = f"{DEFAULT_PROFILE_DIR}/{FLIGHT_RECORDER_SUBDIR}"
    stacks: bool = flags.STACKS.default
    stacks_server: bool = flags.STACKS_SERVER.default
    stacks_control_dir: str = f"{DEFAULT_PROFILE_DIR}/{STACKS_CONTROL_SUBDIR}"

    @property
    def enabled(self) -> bool:
        """PyTorch's flight recorder is on."""
        return self.entries > 0

    @property
    def active(self) -> bool:
        """Something dumps at a hang (the flight recorder, the stacks or both)."""
        return self.enabled or self.stacks

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> FlightRecorderConfig:
        entries = flag_value(args, flags.FLIGHT_RECORDER) or 0
        server = bool(flag_value(args, flags.STACKS_SERVER))
        if entries and not server:
            raise TorchProfileArgsError(
                "--no-torch-profile-stacks-server with --torch-profile-flight-recorder: the recorder's dump "
                "at an NCCL watchdog timeout is noticed by the stacks server's thread; drop one of the two.")
        return cls(entries=entries, output_dir=f"{profile_dir(args)}/{FLIGHT_RECORDER_SUBDIR}",
                   stacks=bool(flag_value(args, flags.STACKS)) or entries > 0, stacks_server=server,
                   stacks_control_dir=f"{profile_dir(args)}/{STACKS_CONTROL_SUBDIR}")


@dataclasses.dataclass(frozen=True)
class DebugServerConfig:
    """PyTorch's debug server (``--torch-profile-debug-server``): the frontend's port on rank 0, where
    and how often it dumps (``dump_interval`` 0: never), and what this package's pages drive (the
    on-demand control directory, None without ``--torch-profile-on-demand``; the profile directory,
    whose latest cycle the brief page reads)."""

    enabled: bool = config_field(flags.DEBUG_SERVER)
    port: int = config_field(flags.DEBUG_SERVER_PORT)
    dump_interval: float = config_field(flags.DEBUG_SERVER_DUMP_INTERVAL)
    dump_dir: str = f"{DEFAULT_PROFILE_DIR}/{DEBUG_SERVER_SUBDIR}"
    profile_dir: str = DEFAULT_PROFILE_DIR
    control_dir: str | None = None

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, *, on_demand: OnDemandConfig) -> DebugServerConfig:
        values = config_values(cls, args)
        if not values["enabled"]:
            for flag in (flags.DEBUG_SERVER_PORT, flags.DEBUG_SERVER_DUMP_INTERVAL):
                if was_given(args, flag):
                    raise TorchProfileArgsError(f"{flag.option} needs --torch-profile-debug-server.")
        directory = profile_dir(args)
        return cls(**values, dump_dir=f"{directory}/{DEBUG_SERVER_SUBDIR}", profile_dir=directory,
                   control_dir=on_demand.control_dir if on_demand.enabled else None)


@dataclasses.dataclass(frozen=True)
class ProfilerConfig:
    """Everything :class:`~torchprof_args.capture.runtime.profiler.TorchProfiler` follows."""

    trace: TraceConfig = TraceConfig()
    export: ExportConfig = ExportConfig()
    memory: MemorySnapshotConfig = MemorySnapshotConfig()
    nsys: NsysConfig = NsysConfig()
    on_demand: OnDemandConfig = OnDemandConfig()
    flight_recorder: FlightRecorderConfig = FlightRecorderConfig()
    debug_server: DebugServerConfig = DebugServerConfig()

    @property
    def follows_schedule(self) -> bool:
        """Whether a feature that follows the schedule is on (traces, memory snapshots, nsys)."""
        return self.trace.enabled or self.memory.enabled or self.nsys.enabled

    @property
    def enabled(self) -> bool:
        return self.follows_schedule or self.on_demand.enabled


class ProfiledRun(Protocol):
    """What ``TorchProfiler.from_config`` (:mod:`torchprof_args.capture.runtime.profiler`) reads of a
    run's checked configs: :class:`torchprof_args.capture.config.RunConfig` is one (the runtime
    cannot import it: ``config.py`` sits above it)."""

    @property
    def profiler(self) -> ProfilerConfig: ...

    @property
    def start_iteration(self) -> int: ...
