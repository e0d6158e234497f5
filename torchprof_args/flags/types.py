"""argparse ``type=`` functions shared by the flag groups.

A bad value surfaces inside ``parse_args`` as ``error: argument --flag: <message>`` (exit code
2), before any training code runs.  Types that belong to one feature live with that feature's
flag group.
"""

from __future__ import annotations

import argparse

__all__ = ["gzip_level", "non_negative_int", "positive_float", "positive_int", "rank_token"]


def _whole_number(text: str, expected: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def non_negative_int(text: str) -> int:
    """An integer >= 0 (step counts)."""
    value = _whole_number(text, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _whole_number(text, "a whole number >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """A number > 0 (seconds, sizes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def rank_token(text: str) -> int | str:
    """A global rank (integer >= 0) or the word ``all``."""
    if text.lower() == "all":
        return "all"
    value = _whole_number(text, "global ranks (whole numbers >= 0) or 'all'")
    if value < 0:
        raise argparse.ArgumentTypeError(f"ranks must be >= 0, got {value}")
    return value


def gzip_level(text: str) -> int:
    """A zlib compression level 1..9."""
    value = _whole_number(text, "a level 1..9")
    if not 1 <= value <= 9:
        raise argparse.ArgumentTypeError(f"must be between 1 and 9, got {value}")
    return value
