"""Writing the ``traceEvents`` array of a Chrome trace piece by piece."""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any

import msgspec

__all__ = ["ArrayWriter"]


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
