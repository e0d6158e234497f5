"""A tool's document cut down to the server's result size (``--max-result-kb``).

A document within the limit is returned as it is.  A larger one is cut in three passes, each only
as far as needed: first the lists of plain entries (no list inside them: top operators, a
finding's evidence, an instance's ranks) are halved down to :data:`LEAF_KEPT` entries, the largest
lists first and every list at least half as large in the same round; then any list, the largest by
its JSON size first, down to one entry; then the ends of the longest strings.  Lists keep their
first entries (the commands sort them most important first), so the document keeps its shape:
every rank's summary and the cross-rank view before the tails of their top-N lists.  The cuts are
listed, so the reader knows what is missing, and the server adds where the whole document is.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["STRING_KEPT", "bound"]

#: Characters a cut string keeps.
STRING_KEPT = 2000
#: Entries a list of plain entries keeps before lists of records are cut.
LEAF_KEPT = 5

#: Where a value sits in the document: (its container, its key or index).
_Slot = tuple[Any, Any]


def _size(value: Any) -> int:
    return len(json.dumps(value))


def _walk(value: Any, where: str, found: list[tuple[str, _Slot, Any, bool]], slot: _Slot | None) -> bool:
    """Every list and long string below ``value`` with its path, its slot and whether it is a leaf (no
    list inside); returns whether ``value`` holds a list."""
    holds = False
    if isinstance(value, dict):
        for key, item in value.items():
            holds |= _walk(item, f"{where}/{key}", found, (value, key))
    elif isinstance(value, list):
        inner = False
        for index, item in enumerate(value):
            inner |= _walk(item, f"{where}/{index}", found, (value, index))
        if slot is not None:
            found.append((where, slot, value, not inner))
        holds = True
    elif isinstance(value, str) and slot is not None and len(value) > STRING_KEPT:
        found.append((where, slot, value, True))
    return holds


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

    def halve(where: str, slot: _Slot, items: list[Any], floor: int) -> None:
        container, key = slot
        originals.setdefault(where, len(items))
        container[key] = items[: max(floor, len(items) // 2)]
        cuts[where] = f"kept {len(container[key])} of {originals[where]}"

    for floor, leaves_only in ((LEAF_KEPT, True), (1, False)):
        while _size(doc) > max_bytes:
            found: list[tuple[str, _Slot, Any, bool]] = []
            _walk(doc, "", found, None)
            lists = [(_size(v), where, slot, v) for where, slot, v, leaf in found
                     if isinstance(v, list) and len(v) > floor and (leaf or not leaves_only)]
            if not lists:
                break
            largest = max(size for size, *_ in lists)
            for size, where, slot, items in lists if leaves_only else [max(lists, key=lambda x: x[0])]:
                if size * 2 >= largest:
                    halve(where, slot, items, floor)
    while _size(doc) > max_bytes:
        found = []
        _walk(doc, "", found, None)
        strings = [(len(v), where, slot, v) for where, slot, v, _ in found if isinstance(v, str)]
        if not strings:
            break
        _, where, (container, key), text = max(strings, key=lambda x: x[0])
        container[key] = text[:STRING_KEPT] + " [cut]"
        cuts[where] = f"kept {STRING_KEPT} of {len(text)} characters"
    return doc, {where: cut for where, cut in cuts.items() if _present(doc, where)}


def _present(doc: Any, where: str) -> bool:
    """Whether the JSON pointer ``where`` is still in ``doc`` (a cut inside a dropped entry is not)."""
    for part in where.split("/")[1:]:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return False
    return True
