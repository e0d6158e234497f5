"""Findings of two runs compared, for ``torchprof diff``: which appeared, disappeared or changed.

Each side is a :func:`~torchprof_args.analysis.diagnose.job.diagnose` result (one cycle); findings are
matched by kind.  A finding present on both sides *changed* when its ``ms_per_step`` moved by more
than :data:`CHANGE_PCT` percent of the larger value and more than :data:`CHANGE_MS`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHANGE_MS", "CHANGE_PCT", "diff_findings", "format_findings_diff"]

CHANGE_PCT = 10.0
CHANGE_MS = 0.5


def _status(base: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    if base is None:
        return "appeared"
    if new is None:
        return "disappeared"
    a, b = base["ms_per_step"], new["ms_per_step"]
    moved = abs(b - a)
    return "changed" if moved > CHANGE_MS and moved > CHANGE_PCT / 100.0 * max(a, b) else "unchanged"


def diff_findings(base: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per kind found on either side: ``{"kind", "status", "base_ms_per_step",
    "new_ms_per_step", "delta_ms_per_step", "base_ranks", "new_ranks", "summary"}``, appeared /
    disappeared / changed first, each by the size of the change."""
    a = {f["kind"]: f for f in base.get("findings") or []}
    b = {f["kind"]: f for f in new.get("findings") or []}
    rows = []
    for kind in list(dict.fromkeys([*a, *b])):
        old, now = a.get(kind), b.get(kind)
        base_ms = old["ms_per_step"] if old else None
        new_ms = now["ms_per_step"] if now else None
        rows.append({"kind": kind, "status": _status(old, now), "base_ms_per_step": base_ms,
                     "new_ms_per_step": new_ms, "delta_ms_per_step": (new_ms or 0.0) - (base_ms or 0.0),
                     "base_ranks": old["ranks"] if old else [], "new_ranks": now["ranks"] if now else [],
                     "summary": (now or old)["summary"]})
    order = {"appeared": 0, "disappeared": 1, "changed": 2, "unchanged": 3}
    rows.sort(key=lambda r: (order[r["status"]], -abs(r["delta_ms_per_step"]), r["kind"]))
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def format_findings_diff(rows: list[dict[str, Any]]) -> list[str]:
    """The text lines ``torchprof diff`` prints for :func:`diff_findings`' rows."""
    if not rows:
        return ["Findings (torchprof diagnose, latest cycle of each side): none on either side"]
    lines = ["Findings (torchprof diagnose, latest cycle of each side), per step: " + ", ".join(
        f"{sum(1 for r in rows if r['status'] == s)} {s}" for s in ("appeared", "disappeared", "changed"))]
    for r in rows:
        if r["status"] == "unchanged":
            continue
        lines.append(f"  {r['status']:<11} {r['kind']:<17} {_ms(r['base_ms_per_step']):>10} -> "
                     f"{_ms(r['new_ms_per_step']):>10}  ({r['delta_ms_per_step']:+.1f} ms)")
    return lines
