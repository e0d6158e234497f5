"""A tool's document cut down to the server's result size (``--max-result-kb``).

A document within the limit is returned as it is.  A larger one loses the tails of its longest
lists first (each halved in turn, the largest by its JSON size, keeping its first entries: the
commands sort them most important first), then the ends of its longest strings; the cuts are listed
so the reader knows what is missing, and the server adds where the whole document is.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["STRING_KEPT", "bound"]

#: Characters a cut string keeps.
STRING_KEPT = 2000

#: Where a value sits in the document: (its container, its key or index).
_Slot = tuple[Any, Any]


def _size(value: Any) -> int:
    return len(json.dumps(value))


def _walk(value: Any, where: str, found: list[tuple[str, _Slot, Any]], slot: _Slot | None) -> None:
    """Every list and string below ``value`` with its path and its slot."""
    if isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{where}/{key}", found, (value, key))
    elif isinstance(value, list):
        if slot is not None:
            found.append((where, slot, value))
        for index, item in enumerate(value):
            _walk(item, f"{where}/{index}", found, (value, index))
    elif isinstance(value, str) and slot is not None and len(value) > STRING_KEPT:
        found.append((where, slot, value))


def bound(doc: dict[str, Any], max_bytes: int) -> tuple[dict[str, Any], dict[str, str]]:
    """``doc`` within ``max_bytes`` of JSON, if cutting lists and strings can get it there.

    Args:
        doc: plain JSON values (a fresh copy: it is cut in place).
        max_bytes: the most characters of ``json.dumps(doc)``.

    Returns:
        The document and its cuts, by JSON pointer (``/findings``: ``"kept 4 of 37"``; empty when
        nothing was cut).  The document may still be larger than ``max_bytes`` when what is left
        cannot be cut (the caller refuses it then).
    """
    cuts: dict[str, str] = {}
    originals: dict[str, int] = {}
    while _size(doc) > max_bytes:
        found: list[tuple[str, _Slot, Any]] = []
        _walk(doc, "", found, None)
        lists = [(_size(v), where, slot, v) for where, slot, v in found if isinstance(v, list) and len(v) > 1]
        if lists:
            _, where, (container, key), items = max(lists, key=lambda x: x[0])
            originals.setdefault(where, len(items))
            container[key] = items[: len(items) // 2]
            cuts[where] = f"kept {len(container[key])} of {originals[where]}"
            continue
        strings = [(len(v), where, slot, v) for where, slot, v in found if isinstance(v, str)]
        if not strings:
            break
        _, where, (container, key), text = max(strings, key=lambda x: x[0])
        container[key] = text[:STRING_KEPT] + " [cut]"
        cuts[where] = f"kept {STRING_KEPT} of {len(text)} characters"
    return doc, cuts
