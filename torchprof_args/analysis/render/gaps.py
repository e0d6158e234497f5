"""What the traces cannot tell, and which flag would record it: a diagnosis's gaps, one sentence per
flag, for the text of ``torchprof diagnose`` and the HTML report of ``torchprof report`` alike.

A CPU-only job lacks what six kinds need, all recorded by ``--torch-profile-activities cpu cuda``:
that is one sentence naming the six kinds, not six sentences naming the flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

__all__ = ["GapGroup", "GapLike", "gap_text_lines", "group_gaps"]


class GapLike(Protocol):
    """A gap as the diagnosis documents hold one (a rank's ``Gap``, the job's ``JobGap``)."""

    @property
    def kind(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def flag(self) -> str | None: ...


@dataclasses.dataclass
class GapGroup:
    """The gaps one flag would fill (``flag`` None: no flag records what they need)."""

    flag: str | None
    #: The kinds it would show, in the diagnosis's order.
    kinds: list[str] = dataclasses.field(default_factory=list)
    #: Each distinct reason with the kinds it explains, first seen first.
    reasons: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def sentence(self) -> str:
        """``to see K1, K2, record with FLAG (reason; K3: other reason)``."""
        how = f"record with {self.flag}" if self.flag else "no flag records it"
        (first, _), *others = self.reasons.items()
        why = "; ".join([first, *(f"{', '.join(kinds)}: {reason}" for reason, kinds in others)])
        return f"to see {', '.join(self.kinds)}, {how} ({why})"


def group_gaps(gaps: Iterable[GapLike]) -> list[GapGroup]:
    """A diagnosis's gaps grouped by flag, in the order each flag first appears."""
    groups: dict[str | None, GapGroup] = {}
    for gap in gaps:
        group = groups.setdefault(gap.flag, GapGroup(gap.flag))
        kind, reason = gap.kind, gap.reason.rstrip(".")
        if kind not in group.kinds:
            group.kinds.append(kind)
        explained = group.reasons.setdefault(reason, [])
        if kind not in explained:
            explained.append(kind)
    return list(groups.values())


def gap_text_lines(gaps: Iterable[GapLike]) -> list[str]:
    """One sentence per flag (:meth:`GapGroup.sentence`)."""
    return [group.sentence() for group in group_gaps(gaps)]
