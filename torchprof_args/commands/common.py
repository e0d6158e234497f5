"""What the trace toolkit's ``torchprof`` commands share: ``--top``'s type and the inputs' help
text.  Import-light (argparse only), like every command module.  Errors are not handled here: a
command raises :class:`~torchprof_args.errors.CommandError` and the console prints it."""

from __future__ import annotations

import argparse

__all__ = ["INPUTS_HELP", "top_count"]

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

