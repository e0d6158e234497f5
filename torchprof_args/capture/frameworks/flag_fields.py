"""The flags as dataclass fields, for hosts whose options are dataclasses: Hugging Face's
``HfArgumentParser`` (``TorchProfileArguments``) and torchtitan's tyro config (its
``[torch_profile]`` section).  Generated from the registry's declarations, never a copy of them.

A field holds a plain value (``bool``, ``int``, ``float``, ``str`` or ``list[str]``) that a host
parser fills from its own command line, JSON or TOML; :func:`namespace_from_fields` then checks it
with its flag's own ``type`` (``non_negative_int``, ``rank_token``, ...: they take a value already
typed as well as text) and ``choices``, so a bad value gives the message of ``--torch-profile-*`` on
a plain parser, naming the option as the host spells it, and returns the ``argparse.Namespace``
that :func:`~torchprof_args.capture.config.configs_from_args` checks as a whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from torchprof_args.capture.config import registered_groups
from torchprof_args.capture.flags import Flag
from torchprof_args.errors import TorchProfileArgsError

__all__ = ["FlagField", "dataclass_fields", "host_flags", "namespace_from_fields", "respell"]

#: The metrics writer's own sinks: under a host with loggers of its own (the Trainer's ``report_to``,
#: torchtitan's metrics processor) the figures go to those, so these flags have nothing to do.
_WRITER_SINK_OPTIONS = frozenset({"--wandb-mode", "--metrics-dir", "--metrics-sinks", "--metrics-rank"})
_BOOLEAN_ACTIONS = ("store_true", "store_false", argparse.BooleanOptionalAction)


@dataclasses.dataclass(frozen=True)
class FlagField:
    """One flag as a dataclass field: ``name`` in the host's dataclass, ``label`` the option as the
    host spells it (what error messages name)."""

    flag: Flag
    name: str
    label: str

    @property
    def is_bool(self) -> bool:
        return self.flag.action in _BOOLEAN_ACTIONS

    @property
    def is_list(self) -> bool:
        return self.flag.nargs in ("+", "*")

    def python_type(self) -> Any:
        """``bool``; ``list[str]`` for a list; else the number a flag's ``type`` gives (``int`` or
        ``float``) or ``str``; ``| None`` when the default is None."""
        if self.is_bool:
            return bool
        if self.is_list:
            return list[str]
        scalar: Any = getattr(self.flag.type, "kind", str)
        return scalar | None if self.flag.default is None else scalar

    def dataclass_field(self, metadata: Mapping[str, Any]) -> Any:
        """The ``dataclasses.field`` with the flag's default (lists as strings, by a factory)."""
        default = self.flag.default
        if self.is_list:
            values = [str(value) for value in default] if default is not None else []
            return dataclasses.field(default_factory=lambda: list(values), metadata=dict(metadata))
        return dataclasses.field(default=default, metadata=dict(metadata))


def host_flags() -> list[Flag]:
    """Every standard flag a dataclass host takes: not the ones a host framework owns (Megatron-LM's
    ``--log-interval``, ``--wandb-project``, ``--tensorboard-dir``...: the host logs) nor the metrics
    writer's sink flags (the host's loggers are the sinks)."""
    return [flag for group in registered_groups() for flag in group.flags
            if not flag.host_owned and flag.option not in _WRITER_SINK_OPTIONS]


def dataclass_fields(
    fields: Sequence[FlagField],
    metadata: Callable[[FlagField], Mapping[str, Any]] = lambda _: {},
    annotate: Callable[[FlagField, Any], Any] = lambda _, kind: kind,
) -> list[tuple[str, Any, Any]]:
    """``(name, type, field)`` triples for ``dataclasses.make_dataclass``; ``metadata`` and
    ``annotate`` let a host add what its parser reads (help, choices, ``Annotated`` markers)."""
    return [(field.name, annotate(field, field.python_type()), field.dataclass_field(metadata(field)))
            for field in fields]


def namespace_from_fields(values: Mapping[str, Any], fields: Iterable[FlagField]) -> argparse.Namespace:
    """The flags' namespace (``dest`` -> value) from a host dataclass's ``values``.

    Each value goes through its flag's ``type`` and ``choices`` as it is (no round trip through
    ``str``): raises :class:`TorchProfileArgsError` naming the host's spelling of the option (``label``).
    """
    namespace = argparse.Namespace()
    for field in fields:
        value = values.get(field.name, field.flag.default)
        setattr(namespace, field.flag.dest, _converted(field, value))
    return namespace


def _converted(field: FlagField, value: Any) -> Any:
    if value is None or field.is_bool:
        return bool(value) if field.is_bool and value is not None else value
    if field.is_list:
        if isinstance(value, str):
            value = value.split()
        return [_one(field, item) for item in value]
    return _one(field, value)


def _one(field: FlagField, value: Any) -> Any:
    flag = field.flag
    try:
        converted = flag.type(value) if flag.type is not None else value
    except (argparse.ArgumentTypeError, ValueError, TypeError) as err:
        raise TorchProfileArgsError(f"{field.label}: {err}") from None
    if flag.choices is not None and converted not in flag.choices:
        raise TorchProfileArgsError(f"{field.label}: invalid choice {value!r} (choose from "
                                    f"{', '.join(map(str, flag.choices))}).")
    return converted


_OPTION = re.compile(r"--[a-z][a-z0-9-]*")


def respell(message: str, fields: Iterable[FlagField]) -> str:
    """``message`` with every flag named as the host spells it (``--torch-profile-step-start`` ->
    ``--torch_profile.step_start``); options the host does not know stay as they are.  For the
    cross-flag checks of :func:`~torchprof_args.capture.config.configs_from_args`, which name the argparse
    spellings (a single value's error names ``label`` already)."""
    labels = {field.flag.option: field.label for field in fields}
    return _OPTION.sub(lambda match: labels.get(match.group(0), match.group(0)), message)
