"""What the trace toolkit's ``torchprof`` commands share: the error guard, ``--top``'s type and
the inputs' help text.  Import-light (argparse only), like every command module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from torchprof_args.errors import TraceError

__all__ = ["INPUTS_HELP", "guard", "top_count"]

INPUTS_HELP = "trace files (.json/.json.gz), cycle folders or run folders"


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


def guard(func: Callable[[argparse.Namespace], int], name: str,
          error_status: int = 1) -> Callable[[argparse.Namespace], int]:
    """Run a command: a :class:`TraceError` becomes one line on stderr and exit status
    ``error_status`` (``diagnose`` says 2: its 1 means some of the traces could not be read)."""
    def run(args: argparse.Namespace) -> int:
        args.command = name
        try:
            return func(args)
        except TraceError as exc:
            print(f"torchprof {name}: error: {exc}", file=sys.stderr)
            return error_status
        except BrokenPipeError:
            return 0

    return run
