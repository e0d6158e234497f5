"""argparse ``type=`` functions shared by the flag groups: each also validates a value a host framework
already typed (a Python, JSON or TOML number), with the same check and message, no round trip through
``str``.

A bad value surfaces inside ``parse_args`` as ``error: argument --flag: <message>`` (exit code
2), before any training code runs.  Types that belong to one feature live with that feature's
flag group.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["Number", "gzip_level", "non_negative_float", "non_negative_int", "port_number", "positive_float",
           "positive_int", "rank_token"]


@dataclasses.dataclass(frozen=True)
class Number:
    """A number flag's type: ``kind`` (``int`` or ``float``) from the command line's text or from a
    value already a number (an ``int`` for a ``float``, never a ``bool``), that ``ok`` accepts;
    ``bound`` says which ones, in both messages (``expected a whole number >= 0, got 'x'``,
    ``must be >= 0, got -1``)."""

    kind: type[int] | type[float]
    bound: str
    ok: Callable[[Any], bool]

    def __call__(self, value: object) -> Any:
        number: Any = None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = self.kind(value)
        elif isinstance(value, (int, float) if self.kind is float else int) and not isinstance(value, bool):
            number = self.kind(value)
        if number is None:
            what = "a whole number" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what} {self.bound}, got {value!r}")
        if not self.ok(number):
            raise argparse.ArgumentTypeError(f"must be {self.bound}, got {value}")
        return number


#: An integer >= 0 (step counts); >= 1; a number > 0 (seconds, sizes); >= 0; a zlib level 1..9.
non_negative_int = Number(int, ">= 0", lambda n: n >= 0)
positive_int = Number(int, ">= 1", lambda n: n >= 1)
positive_float = Number(float, "> 0", lambda n: n > 0)
non_negative_float = Number(float, ">= 0", lambda n: n >= 0)
gzip_level = Number(int, "between 1 and 9", lambda n: 1 <= n <= 9)
#: A TCP port to listen on, 1..65535.
port_number = Number(int, "between 1 and 65535", lambda n: 1 <= n <= 65535)
_RANK = Number(int, ">= 0 or 'all'", lambda n: n >= 0)


def rank_token(value: object) -> int | str:
    """A global rank (integer >= 0) or the word ``all``."""
    return "all" if isinstance(value, str) and value.lower() == "all" else _RANK(value)
