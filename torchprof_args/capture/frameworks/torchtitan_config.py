"""torchtitan's ``[torch_profile]`` config section (torchtitan 0.3: a Python ``config_registry``
function returns a ``Trainer.Config``, tyro parses ``--section.field`` flags): every host flag of the
registry as a field, generated as for Hugging Face (``--torch_profile.enable``,
``--torch_profile.step_start 4``, ``--torch_profile.metrics_peak_tflops 989``...), and
:func:`run_config`, the section's checked configs; every check (the flags', and torchtitan's own
profiler or memory snapshots with ours) raises :class:`~torchprof_args.TorchProfileArgsError` naming
the options as torchtitan spells them.  The derived ``Config`` class and the parser are in
:mod:`~torchprof_args.capture.frameworks.torchtitan_parse`.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Annotated, Any

from torchprof_args.capture.config import RunConfig, configs_from_args
from torchprof_args.capture.frameworks.flag_fields import (
    FlagField,
    dataclass_fields,
    host_flags,
    namespace_from_fields,
    respell,
)
from torchprof_args.capture.runtime.flags import TORCH_PROFILE
from torchprof_args.errors import TorchProfileArgsError

__all__ = ["SECTION", "TorchProfileSection", "run_config", "section_namespace", "titan_fields"]

#: The section's name: ``[torch_profile]`` in a dump of the config, ``--torch_profile.*`` flags.
SECTION = "torch_profile"
_PREFIX = "torch_profile_"


def titan_fields() -> list[FlagField]:
    """Every host flag as a field of the section: ``--torch-profile`` -> ``enable``,
    ``--torch-profile-x-y`` -> ``x_y``, the others by their dest (``metrics_peak_tflops``)."""
    fields = []
    for flag in host_flags():
        name = "enable" if flag is TORCH_PROFILE else flag.dest.removeprefix(_PREFIX)
        fields.append(FlagField(flag, name, f"--{SECTION}.{name}"))
    return fields


def _annotate(field: FlagField, kind: Any) -> Any:
    import tyro

    return Annotated[kind, tyro.conf.arg(help=field.flag.help.replace("%", "%%"))]


#: The ``[torch_profile]`` section: one field per flag, plain values that torchtitan's parser fills.
TorchProfileSection: type = dataclasses.make_dataclass(
    "TorchProfileSection", dataclass_fields(titan_fields(), annotate=_annotate), kw_only=True,
    namespace={"__module__": __name__, "__doc__": "torchprof-args: every --torch-profile-* and "
               "--metrics-* flag (see docs/frameworks/torchtitan.md)."})


def section_namespace(section: Any) -> argparse.Namespace:
    """The flags' namespace of a ``TorchProfileSection`` (each value through its flag's type)."""
    fields = titan_fields()
    return namespace_from_fields({field.name: getattr(section, field.name) for field in fields}, fields)


def run_config(config: Any, world_size: int | None = None) -> RunConfig:
    """The checked configs of ``config.torch_profile``, after refusing torchtitan's own profiler and
    memory snapshots next to ours."""
    fields = titan_fields()
    try:
        run = configs_from_args(section_namespace(config.torch_profile), world_size)
    except TorchProfileArgsError as err:
        raise TorchProfileArgsError(respell(str(err), fields)) from None
    own = config.profiler
    if run.profiler.enabled and getattr(own, "enable_profiling", False):
        raise TorchProfileArgsError(
            f"--{SECTION}.enable cannot run together with torchtitan's --profiler.enable_profiling: both "
            f"drive torch.profiler. Drop --profiler.enable_profiling (--{SECTION}.step_start/step_end choose "
            "the steps; the fence keeps the flush from tripping collective timeouts).")
    if run.profiler.memory.enabled and getattr(own, "enable_memory_snapshot", False):
        raise TorchProfileArgsError(
            f"--{SECTION}.memory_snapshot cannot run together with torchtitan's "
            "--profiler.enable_memory_snapshot: both record the CUDA allocator's history. Keep one.")
    return run
