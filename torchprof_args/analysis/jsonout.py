"""JSON out: strict JSON of analysis results (:func:`finite`, :func:`print_json`) and the
``traceEvents`` array of a Chrome trace written piece by piece (:class:`ArrayWriter`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import IO, Any

import msgspec
import numpy as np

__all__ = ["ArrayWriter", "finite", "print_json"]


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers, for the encoder."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


_encode = msgspec.json.Encoder(enc_hook=_plain)
_decode = msgspec.json.Decoder()


def finite(value: Any) -> Any:
    """A copy of ``value`` as plain JSON values, with NaN/inf replaced by None (strict JSON).

    One JSON round trip in C (msgspec writes non-finite floats as null): a complete summary holds
    thousands of entries, and a Python walk over them cost more than parsing a small trace.

    Args:
        value: dicts, lists, tuples, numbers (numpy's too), strings, msgspec structs.

    Returns:
        The same values as dicts, lists (tuples come back as lists), numbers, strings and None.
    """
    try:
        return _decode.decode(_encode.encode(value))
    except (TypeError, msgspec.EncodeError):
        return _finite_walk(value)


def _finite_walk(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_walk(v) for v in value]
    if isinstance(value, msgspec.Struct):
        return _finite_walk(msgspec.to_builtins(value))
    return value


def print_json(value: Any) -> None:
    """Print ``value`` as one line of strict JSON: what every ``--json`` of ``torchprof`` prints.

    Args:
        value: what :func:`finite` takes (a summary, a report, a msgspec struct such as the
            diagnosis); NaN / inf are printed as null, the keys in their order, ``", "`` and
            ``": "`` between items (Python's ``json.dumps``).
    """
    print(json.dumps(finite(value)))


class ArrayWriter:
    """Writes JSON array elements to ``fh``, ``,\\n`` between them, across any number of calls.

    ``started`` says whether elements were already written (the next one then needs a comma).
    """

    def __init__(self, fh: IO[bytes], started: bool = False) -> None:
        self.fh = fh
        self.first = not started

    def write_raw(self, elements: Iterable[Any]) -> None:
        """Write already-encoded elements (bytes or ``msgspec.Raw``)."""
        elements = list(elements)
        if not elements:
            return
        chunk = b",\n".join(elements)
        self.fh.write(chunk if self.first else b",\n" + chunk)
        self.first = False

    def write(self, events: Iterable[Any]) -> None:
        """Encode and write ``events`` (dicts)."""
        self.write_raw([msgspec.json.encode(e) for e in events])
