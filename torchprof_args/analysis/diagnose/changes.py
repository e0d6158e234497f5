"""Findings of two runs compared, for ``torchprof diff``: which appeared, disappeared or changed.

Each side is a :func:`~torchprof_args.analysis.diagnose.job_findings.diagnose` result (one cycle); findings
are matched by kind, in the registry's order.  A finding present on both sides *changed* when its
``ms_per_step`` moved by more than :data:`CHANGE_PCT` percent of the larger value and more than
:data:`CHANGE_MS`.
"""

from __future__ import annotations

import msgspec

from torchprof_args.analysis.diagnose.documents import JobDiagnosis
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.diagnose.registry import KINDS

__all__ = ["CHANGE_MS", "CHANGE_PCT", "FindingChange", "diff_findings", "format_findings_diff"]

CHANGE_PCT = 10.0
CHANGE_MS = 0.5


class FindingChange(msgspec.Struct, frozen=True):
    """One kind compared (a row of ``diff --json``'s ``findings``).

    ``status``: appeared, disappeared, changed or unchanged; the times are ms per step (None: the
    side has no such finding); ``summary``: the new side's finding's, else the base's.
    """

    kind: str
    status: str
    base_ms_per_step: float | None
    new_ms_per_step: float | None
    delta_ms_per_step: float
    base_ranks: list[int]
    new_ranks: list[int]
    summary: str


def _status(base: Finding | None, new: Finding | None) -> str:
    if base is None:
        return "appeared"
    if new is None:
        return "disappeared"
    a, b = base.ms_per_step, new.ms_per_step
    moved = abs(b - a)
    return "changed" if moved > CHANGE_MS and moved > CHANGE_PCT / 100.0 * max(a, b) else "unchanged"


def _change(kind: str, old: Finding | None, now: Finding | None) -> FindingChange:
    base_ms = old.ms_per_step if old else None
    new_ms = now.ms_per_step if now else None
    either = now or old
    return FindingChange(
        kind=kind, status=_status(old, now), base_ms_per_step=base_ms, new_ms_per_step=new_ms,
        delta_ms_per_step=(new_ms or 0.0) - (base_ms or 0.0), base_ranks=list(old.ranks) if old else [],
        new_ranks=list(now.ranks) if now else [], summary=either.summary if either else "")


def diff_findings(base: JobDiagnosis | None, new: JobDiagnosis | None) -> list[FindingChange]:
    """One row per kind found on either side.

    Args:
        base: the reference's diagnosis (None: it has none).
        new: the compared run's.

    Returns:
        Appeared / disappeared / changed rows first, each by the size of the change, then the
        unchanged ones.
    """
    a = {f.kind: f for f in (base.findings if base else [])}
    b = {f.kind: f for f in (new.findings if new else [])}
    rows = [_change(kind, a.get(kind), b.get(kind)) for kind in KINDS if kind in a or kind in b]
    order = {"appeared": 0, "disappeared": 1, "changed": 2, "unchanged": 3}
    rows.sort(key=lambda r: (order[r.status], -abs(r.delta_ms_per_step), r.kind))
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def format_findings_diff(rows: list[FindingChange]) -> list[str]:
    """The text lines ``torchprof diff`` prints for :func:`diff_findings`' rows."""
    if not rows:
        return ["Findings (torchprof diagnose, latest cycle of each side): none on either side"]
    lines = ["Findings (torchprof diagnose, latest cycle of each side), per step: " + ", ".join(
        f"{sum(1 for r in rows if r.status == s)} {s}" for s in ("appeared", "disappeared", "changed"))]
    for r in rows:
        if r.status == "unchanged":
            continue
        lines.append(f"  {r.status:<11} {r.kind:<17} {_ms(r.base_ms_per_step):>10} -> "
                     f"{_ms(r.new_ms_per_step):>10}  ({r.delta_ms_per_step:+.1f} ms)")
    return lines
