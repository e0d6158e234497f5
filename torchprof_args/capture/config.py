"""The one boundary between parsed flags and code: ``argparse.Namespace`` in, frozen configs out.

:func:`add_torch_profile_args` adds every registered flag group to a parser (each feature's
``config`` module declares and registers its own group); :func:`configs_from_args` reads the
parsed namespace once, runs every single-group, cross-flag and environment check, and returns a
:class:`RunConfig`.  Nothing below this module reads the namespace.

Import-light: the feature config modules import no torch, wandb, deepspeed or megatron.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from torchprof_args import _dist
from torchprof_args.capture.flags import add_flag_groups, registered_groups
from torchprof_args.capture.flags.table import flag_table_markdown
from torchprof_args.capture.metrics.config import MetricsConfig, TimersConfig
from torchprof_args.capture.ondemand.config import OnDemandConfig
from torchprof_args.capture.runtime.config import (
    DebugServerConfig,
    ExportConfig,
    FlightRecorderConfig,
    MemorySnapshotConfig,
    NsysConfig,
    ProfilerConfig,
    TraceConfig,
    profile_dir,
)
from torchprof_args.errors import TorchProfileArgsError

__all__ = [
    "RunConfig",
    "add_torch_profile_args",
    "configs_from_args",
    "flag_reference_markdown",
    "validate_args",
]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every feature's config for one run.  ``start_iteration`` is the host's resume point
    (Megatron-LM sets ``args.iteration`` when it loads a checkpoint)."""

    profiler: ProfilerConfig
    timers: TimersConfig
    metrics: MetricsConfig
    start_iteration: int = 0


def add_torch_profile_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the torchprof-args flag groups to a parser.

    Usable as Megatron-LM's ``extra_args_provider``, beside DeepSpeed's
    ``deepspeed.add_config_arguments`` and on any plain parser.  Options the host parser already
    defines are reused, never redefined.

    Args:
        parser: the application's parser.

    Returns:
        ``parser`` itself, so it chains.
    """
    return add_flag_groups(parser, registered_groups())


def flag_reference_markdown() -> str:
    """The flag table of docs/reference/flags.md (``torchprof flags --markdown``)."""
    return flag_table_markdown(registered_groups())


def configs_from_args(args: argparse.Namespace, world_size: int | None = None) -> RunConfig:
    """Check the flags in ``args`` and turn them into configs: THE boundary (below it no module reads
    the namespace).

    Idempotent: it never changes ``args``.

    Args:
        args: the parsed namespace (:func:`add_torch_profile_args`'s flags in it).
        world_size: the job's size for the rank flags' checks; defaults to the initialised process
            group's, else ``$WORLD_SIZE`` (unchecked when neither is known).

    Returns:
        The :class:`RunConfig`: the profiler's, the timers' and the metrics' frozen configs.

    Raises:
        TorchProfileArgsError: a flag or a combination is wrong (a ``ValueError``; the message names
            the flags and says what to do).
    """
    world_size = world_size if world_size is not None else _dist.world_size_if_known()
    directory = profile_dir(args)
    trace = TraceConfig.from_namespace(args)
    export = ExportConfig.from_namespace(args)
    on_demand = OnDemandConfig.from_namespace(args, profile_dir=directory, warmup=trace.schedule.warmup,
                                              gzip=export.gzip_level is not None)
    profiler = ProfilerConfig(trace=trace, export=export, memory=MemorySnapshotConfig.from_namespace(args),
                              nsys=NsysConfig.from_namespace(args), on_demand=on_demand,
                              flight_recorder=FlightRecorderConfig.from_namespace(args),
                              debug_server=DebugServerConfig.from_namespace(args, on_demand=on_demand))
    run = RunConfig(
        profiler=profiler,
        timers=TimersConfig.from_namespace(args, nvtx=profiler.nsys.enabled),
        metrics=MetricsConfig.from_namespace(args, profile_dir=directory, world_size=world_size),
        start_iteration=int(getattr(args, "iteration", 0) or 0),
    )
    _check_environment(profiler, world_size)
    return run


def validate_args(args: argparse.Namespace, world_size: int | None = None) -> argparse.Namespace:
    """:func:`configs_from_args` for its checks only.

    Args:
        args: the parsed namespace.
        world_size: as :func:`configs_from_args` takes it.

    Returns:
        ``args`` itself, so it can be chained.

    Raises:
        TorchProfileArgsError: as :func:`configs_from_args`.
    """
    configs_from_args(args, world_size)
    return args


def _check_environment(profiler: ProfilerConfig, world_size: int | None) -> None:
    """Ranks against the world size, directories writable: before training starts."""
    if profiler.on_demand.enabled:
        check_writable_dir(profiler.on_demand.trace_dir, "--torch-profile-dir")
    if profiler.flight_recorder.active:
        check_writable_dir(profiler.flight_recorder.output_dir, "--torch-profile-dir")
    if profiler.debug_server.enabled and profiler.debug_server.dump_interval:
        check_writable_dir(profiler.debug_server.dump_dir, "--torch-profile-dir")
    if not profiler.follows_schedule:
        return
    ranks = profiler.trace.ranks
    if world_size is not None and ranks is not None and not profiler.trace.parallel_ranks:
        outside = [r for r in ranks if r >= world_size]
        if outside:
            raise TorchProfileArgsError(
                f"--torch-profile-ranks {' '.join(map(str, outside))} outside the world size {world_size} "
                f"(valid ranks are 0..{world_size - 1}).")
    check_writable_dir(profiler.trace.output_dir, "--torch-profile-dir")
    if profiler.export.staging_dir:
        check_writable_dir(profiler.export.staging_dir, "--torch-profile-staging-dir")


def check_writable_dir(path: str, flag: str) -> None:
    """Create ``path`` if needed and prove a file can be written there; else a one-line error
    naming ``flag``."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise TorchProfileArgsError(f"{flag} {path!r} cannot be created ({err.strerror or err}); choose a "
                                    "directory you can write to.") from None
    probe = os.path.join(path, f".torchprof-write-probe-{os.getpid()}")
    try:
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as err:
        raise TorchProfileArgsError(f"{flag} {path!r} is not writable ({err.strerror or err}); choose a "
                                    "directory you can write to.") from None
