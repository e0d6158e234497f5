"""``TorchProfileArguments``: the ``--torch-profile-*`` and ``--metrics-*`` flags as a dataclass for
Hugging Face's ``HfArgumentParser`` (and TRL's ``TrlParser``, a subclass), generated from the same
declarations as the argparse plugin.

``HfArgumentParser`` turns each field ``torch_profile_step_start`` into ``--torch_profile_step_start``
and ``--torch-profile-step-start``; a boolean into ``--torch_profile [true|false]`` (``--no-...`` for
those on by default).  A value of the wrong kind stops the parse with argparse's own line; a bad
value or combination is caught when the dataclass is built (``__post_init__``, the whole
``configs_from_args`` check): built by a parser, the parse ends as argparse ends it, with one line
``<prog>: error: <what to do>`` and exit status 2; built in Python, it raises
:class:`~torchprof_args.TorchProfileArgsError`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from types import FrameType
from typing import Any

from torchprof_args.capture.config import RunConfig, configs_from_args
from torchprof_args.capture.frameworks.flag_fields import (
    FlagField,
    dataclass_fields,
    host_flags,
    namespace_from_fields,
)
from torchprof_args.capture.runtime.flags import FLIGHT_RECORDER, FlightRecorderAction, profile_dir
from torchprof_args.errors import TorchProfileArgsError

__all__ = ["ARGUMENT_GROUP", "TorchProfileArguments", "TorchProfileArgumentsBase", "huggingface_fields"]

#: The ``--help`` group HfArgumentParser puts the fields in.
ARGUMENT_GROUP = "torch profiler, step timers and MFU (torchprof-args)"
#: Frames between ``__post_init__`` and the parser method that built the dataclass (parse_dict).
_PARSER_FRAMES = 6


def huggingface_fields() -> list[FlagField]:
    """Every host flag as a field named by its argparse ``dest`` (``--torch-profile-x`` ->
    ``torch_profile_x``); HfArgumentParser accepts the option's own spelling too."""
    return [FlagField(flag, flag.dest, flag.option) for flag in host_flags()]


def _metadata(field: FlagField) -> dict[str, Any]:
    """What HfArgumentParser passes on to ``add_argument``: help, metavar, choices, old spellings;
    the flight recorder's action, which configures PyTorch as soon as the option is parsed."""
    flag = field.flag
    metadata: dict[str, Any] = {"help": flag.help.replace("%", "%%")}
    if flag.metavar and not field.is_bool:
        metadata["metavar"] = flag.metavar
    if flag.choices is not None and not field.is_list:
        metadata["choices"] = list(flag.choices)
    aliases = [spelling for alias in flag.aliases for spelling in (alias, "--" + alias[2:].replace("-", "_"))]
    if aliases and not field.is_bool:
        metadata["aliases"] = aliases
    if flag is FLIGHT_RECORDER:
        metadata["action"] = FlightRecorderAction
    return metadata


class TorchProfileArgumentsBase:
    """What every generated ``TorchProfileArguments`` does besides holding its fields."""

    _argument_group_name = ARGUMENT_GROUP

    def __post_init__(self) -> None:
        try:
            namespace = self.to_namespace()
            configs_from_args(namespace)
        except TorchProfileArgsError as err:
            parser = _parser_building_this()
            if parser is None:
                raise
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        entries = getattr(namespace, FLIGHT_RECORDER.dest, None)
        if entries:  # as the argparse option does at parse time: before init_process_group
            from torchprof_args.capture.runtime.flight_recorder_env import configure_environment

            configure_environment(int(entries), profile_dir(namespace))

    def to_namespace(self) -> argparse.Namespace:
        """The flags as the argparse plugin's namespace (every value through its flag's type)."""
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}  # type: ignore[arg-type]
        return namespace_from_fields(values, huggingface_fields())

    def run_config(self, world_size: int | None = None) -> RunConfig:
        """Checked configs (:func:`~torchprof_args.capture.config.configs_from_args`); ``world_size`` defaults
        to the process group's, else ``$WORLD_SIZE``."""
        return configs_from_args(self.to_namespace(), world_size)


def _parser_building_this() -> argparse.ArgumentParser | None:
    """The argument parser whose method is constructing this dataclass (HfArgumentParser's
    ``parse_args_into_dataclasses`` / ``parse_dict``), if any: its errors end the parse its way."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_PARSER_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, argparse.ArgumentParser):
            return owner
        frame = frame.f_back
    return None


#: ``HfArgumentParser((TrainingArguments, TorchProfileArguments))``: one field per flag (see the
#: module docstring); ``TorchProfileCallback(profile_args)`` takes an instance.
TorchProfileArguments: type[TorchProfileArgumentsBase] = dataclasses.make_dataclass(
    "TorchProfileArguments",
    dataclass_fields(huggingface_fields(), metadata=_metadata),
    bases=(TorchProfileArgumentsBase,),
    namespace={"__module__": __name__, "__doc__": "Every --torch-profile-* and --metrics-* flag as a "
               "dataclass field, for HfArgumentParser (see torchprof_args.huggingface)."},
)
