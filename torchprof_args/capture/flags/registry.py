"""The flag registry: every command-line flag is declared once, as data.

Features declare their flags as :class:`Flag` constants in a :class:`FlagGroup` and call
:func:`register_group` when their ``config`` module is imported; the registry itself knows no
feature.  From the same declarations come the argparse groups (:func:`add_flag_groups`), the
help text, the docs' flag table (:mod:`torchprof_args.capture.flags.table`) and, at the one boundary where
flags become configs (:mod:`torchprof_args.capture.config`), the values (:func:`flag_value`) and whether
the user gave an option or left its default (:func:`was_given`).

Flags that a host framework may already define (Megatron-LM's ``--tensorboard-dir``,
``--log-interval``, ...) are marked ``host_owned``: when the host parser has the option we read
its value instead of redefining it, so the plugin never clashes with the host.  A renamed flag
keeps its old spellings as ``aliases``: they parse to the same ``dest`` (and count as given) but
appear neither in ``--help`` nor in the README table.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

__all__ = [
    "Flag",
    "FlagGroup",
    "add_flag_groups",
    "config_field",
    "config_values",
    "flag_value",
    "register_group",
    "registered_groups",
    "was_given",
]

#: The argparse actions a :class:`Flag` names (others: pass the action class).
ActionName = Literal["store", "store_true", "store_false"]
_ActionClass = type[argparse.Action]  # (inside Flag, ``type`` is its field)

#: Attribute on a parsed namespace: the ``dest`` of every option given on the command line.
GIVEN_ATTR = "_torch_profile_given"


@dataclasses.dataclass(frozen=True)
class Flag:
    """One command-line flag; :meth:`argparse_kwargs` go straight to ``add_argument``."""

    option: str
    help: str
    default: Any = None  # argparse's default: any value the flag's type gives
    type: Callable[[str], Any] | None = None
    action: ActionName | _ActionClass | None = None
    nargs: str | int | None = None
    choices: Sequence[Any] | None = None
    metavar: str | None = None
    #: A host framework (Megatron-LM) may define this option; reuse it if present.
    host_owned: bool = False
    #: What the flag table shows as the default when ``default`` does not say it well.
    default_doc: str | None = None
    #: Old spellings that still parse to this flag's ``dest``; hidden from help and the README.
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"help": self.help, "default": self.default}
        for key in ("type", "nargs", "choices", "metavar"):
            value = getattr(self, key)
            if value is not None:
                kwargs[key] = value
        kwargs["action"] = _tracking_action(self.action)
        if self.action in ("store_true", "store_false"):
            kwargs.pop("type", None)
        return kwargs

    def alias_kwargs(self) -> dict[str, Any]:
        """``add_argument`` keywords of the hidden :attr:`aliases`: same ``dest`` and action, no
        help, no default of their own (the flag's own option sets it)."""
        return {**self.argparse_kwargs(), "dest": self.dest, "help": argparse.SUPPRESS,
                "default": argparse.SUPPRESS}

    @property
    def options(self) -> tuple[str, ...]:
        """Every spelling: the option, then its aliases."""
        return (self.option, *self.aliases)

    def default_text(self) -> str:
        if self.default_doc is not None:
            return self.default_doc
        if self.action == "store_true":
            return "off"
        if self.action is argparse.BooleanOptionalAction:
            return "on" if self.default else "off"
        if isinstance(self.default, (list, tuple)):
            return " ".join(str(v) for v in self.default)
        return "unset" if self.default is None else str(self.default)


@dataclasses.dataclass(frozen=True)
class FlagGroup:
    """A titled group of flags, as in ``--help``.  ``order`` places it in help and the flag table;
    groups with ``standard=False`` are added only by the entry point that asks for them."""

    title: str
    description: str
    flags: tuple[Flag, ...]
    order: int = 100
    standard: bool = True


_GROUPS: dict[str, FlagGroup] = {}


def register_group(group: FlagGroup) -> FlagGroup:
    """Add ``group`` to the registry (idempotent for the same group); returns it."""
    known = _GROUPS.get(group.title)
    if known is not None and known != group:
        raise ValueError(f"two different flag groups are titled {group.title!r}")
    taken = {option for other in _GROUPS.values() if other.title != group.title for flag in other.flags
             for option in flag.options}
    clash = sorted(taken & {option for flag in group.flags for option in flag.options})
    if clash:
        raise ValueError(f"flag group {group.title!r} redefines {', '.join(clash)}")
    _GROUPS[group.title] = group
    return group


def registered_groups(*, standard_only: bool = True) -> list[FlagGroup]:
    """The registered groups in their ``order`` (only ``standard`` ones unless asked)."""
    groups = [g for g in _GROUPS.values() if g.standard or not standard_only]
    return sorted(groups, key=lambda g: g.order)


def _host_has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in parser._option_string_actions  # noqa: SLF001  (stable since Python 2.7)


def add_flag_groups(parser: argparse.ArgumentParser, groups: Iterable[FlagGroup]) -> argparse.ArgumentParser:
    """Add ``groups`` to ``parser``, skipping options the parser already has; returns it."""
    for spec in groups:
        group = None
        for flag in spec.flags:
            if _host_has_option(parser, flag.option):
                continue
            if group is None:
                group = parser.add_argument_group(spec.title, spec.description)
            group.add_argument(flag.option, **flag.argparse_kwargs())
            aliases = [alias for alias in flag.aliases if not _host_has_option(parser, alias)]
            if aliases:
                group.add_argument(*aliases, **flag.alias_kwargs())
    return parser


# ---------------------------------------------------------------------------------------------
# Reading a parsed namespace (only the config boundary does this).


def flag_value(args: argparse.Namespace, flag: Flag) -> Any:
    """The value of ``flag`` in ``args``, or its declared default where ``args`` has none (the host
    parser lacks the option, or a namespace built by hand holds None)."""
    value = getattr(args, flag.dest, None)
    return flag.default if value is None else value


def was_given(args: argparse.Namespace, flag: Flag) -> bool:
    """Whether the user gave ``flag`` (rather than leaving its default).

    Parsers built by :func:`add_flag_groups` record given options on the namespace; for any
    other namespace (built by hand, or by a host's own option) a value other than the default
    counts as given.
    """
    given = vars(args).get(GIVEN_ATTR)
    if given is not None and flag.dest in given:
        return True
    value = getattr(args, flag.dest, flag.default)
    return value != flag.default and value is not None


_ACTION_CLASSES: dict[ActionName | None, type[argparse.Action]] = {
    None: argparse._StoreAction,  # noqa: SLF001
    "store": argparse._StoreAction,  # noqa: SLF001
    "store_true": argparse._StoreTrueAction,  # noqa: SLF001
    "store_false": argparse._StoreFalseAction,  # noqa: SLF001
}
_TRACKING: dict[type[argparse.Action], type[argparse.Action]] = {}


def _tracking_action(action: ActionName | type[argparse.Action] | None) -> type[argparse.Action]:
    """``action`` (a name or class) as a class that also records that the option was given."""
    base = action if isinstance(action, type) else _ACTION_CLASSES[action]
    tracking = _TRACKING.get(base)
    if tracking is None:

        def __call__(self: argparse.Action, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: Any, option_string: str | None = None) -> None:
            base.__call__(self, parser, namespace, values, option_string)
            given = vars(namespace).setdefault(GIVEN_ATTR, set())
            given.add(self.dest)

        tracking = type(f"Tracking{base.__name__.lstrip('_')}", (base,), {"__call__": __call__})
        _TRACKING[base] = tracking
    return tracking


#: Where :func:`config_field` keeps a config field's flag (the field's metadata).
_FLAG_KEY = "torchprof_flag"


def config_field(flag: Flag) -> Any:
    """A field of a feature's frozen config that holds ``flag``'s value as it is: its default the
    flag's, its value read by :func:`config_values`.  So each such option is bound to its config once
    (a field whose value combines flags, or is checked against another, stays written out in the
    config's ``from_namespace``)."""
    return dataclasses.field(default=flag.default, metadata={_FLAG_KEY: flag})


def config_values(config: type, args: argparse.Namespace) -> dict[str, Any]:
    """The value in ``args`` of every :func:`config_field` of the dataclass ``config``, by field name
    (:func:`flag_value`; a ``bool`` field gets a bool).

    Args:
        config: a dataclass whose fields include :func:`config_field` ones.
        args: the parsed namespace.

    Returns:
        ``{field name: value}``, the keyword arguments for those fields.
    """
    values: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        flag = field.metadata.get(_FLAG_KEY)
        if flag is not None:
            value = flag_value(args, flag)
            values[field.name] = bool(value) if field.type in ("bool", bool) else value
    return values
