"""What the ``torchprof`` commands share: the sub-parsers each ``register`` adds to, ``--top``'s type
and the trace inputs' help text.  Import-light (argparse only), like every command module.  Errors
are not handled here: a command raises :class:`~torchprof_args.errors.CommandError` and the console
prints it."""

from __future__ import annotations

import argparse
from typing import Any, Protocol

__all__ = ["INPUTS_HELP", "Subparsers", "add_clock_option", "top_count"]


class Subparsers(Protocol):
    """What a command module's ``register(subparsers)`` adds its parser to: the console's
    ``add_subparsers()`` action."""

    def add_parser(self, name: str, *args: Any, **kwargs: Any) -> argparse.ArgumentParser:
        """A new sub-command's parser (argparse's ``add_parser``)."""
        ...

INPUTS_HELP = "trace files (.json/.json.gz), cycle folders or run folders"


def add_clock_option(parser: argparse.ArgumentParser) -> None:
    """``--no-align-clocks``: the one switch of every command that compares ranks' times."""
    parser.add_argument("--no-align-clocks", dest="align_clocks", action="store_false",
                        help="compare the ranks' times as written: on several hosts their clocks are "
                             "otherwise aligned at the collectives they share (the offsets are still "
                             "estimated and said)")


def top_count(text: str) -> int | None:
    """``--top``: a number of entries, or ``all`` (None)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'all', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 or 'all', got {value}")
    return value

