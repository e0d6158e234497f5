"""Two runs' critical paths compared, for ``torchprof diff``: the step, and where the path's time
went, by category and by the operators and kernels on it (ms per step, each side's mean over its
steps)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgspec

from torchprof_args.analysis.critical_path.categories import CATEGORIES
from torchprof_args.analysis.critical_path.path import CriticalPathDoc

__all__ = ["PathChange", "compare_paths", "format_path_diff"]


class PathChange(msgspec.Struct, frozen=True):
    """``diff --json``'s ``critical_path``: each side's step and path by category (ms per step), the
    changes, and the operators / kernels whose time on the path moved most."""

    base_step_ms: float | None
    new_step_ms: float | None
    base_by_category: dict[str, float]
    new_by_category: dict[str, float]
    delta_by_category: dict[str, float]
    top_changes: list[dict[str, Any]]


def _by_category(doc: CriticalPathDoc) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for step in doc.steps:
        for name, ms in step.by_category.items():
            totals[name] += ms / len(doc.steps)
    return {c: round(totals[c], 3) for c in CATEGORIES if totals.get(c)}


def compare_paths(base: CriticalPathDoc | None, new: CriticalPathDoc | None,
                  limit: int = 8) -> PathChange | None:
    """The change of the critical path from ``base`` to ``new`` (None when a side has none)."""
    if base is None or new is None or not base.steps or not new.steps:
        return None
    a, b = _by_category(base), _by_category(new)
    delta = {c: round(b.get(c, 0.0) - a.get(c, 0.0), 3) for c in CATEGORIES if c in a or c in b}
    names: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for side, doc in enumerate((base, new)):
        for entry in doc.top:
            names[(entry.name, entry.category)][side] += entry.ms_per_step
    moved = sorted(names.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))[:limit]
    top = [{"name": name, "category": category, "base_ms_per_step": round(x, 3),
            "new_ms_per_step": round(y, 3),
            "delta_ms_per_step": round(y - x, 3)} for (name, category), (x, y) in moved if abs(y - x) > 0]
    return PathChange(base.step_ms, new.step_ms, a, b, delta, top)


def format_path_diff(change: PathChange | None) -> list[str]:
    """The text lines ``torchprof diff`` prints for :func:`compare_paths`."""
    if change is None:
        return ["Critical path (torchprof critical-path): not on both sides"]
    step = (f"{change.base_step_ms:.1f} ms -> {change.new_step_ms:.1f} ms"
            if change.base_step_ms is not None and change.new_step_ms is not None else "-")
    lines = [f"Critical path (torchprof critical-path), per step: step {step}"]
    for name, d in sorted(change.delta_by_category.items(), key=lambda kv: -abs(kv[1])):
        lines.append(f"  {name.replace('_', ' '):<17} {change.base_by_category.get(name, 0.0):>9.1f} ms -> "
                     f"{change.new_by_category.get(name, 0.0):>9.1f} ms  ({d:+.1f} ms)")
    for entry in change.top_changes[:5]:
        lines.append(f"  on the path: {entry['name'][:70]} ({entry['category'].replace('_', ' ')}) "
                     f"{entry['base_ms_per_step']:.1f} -> {entry['new_ms_per_step']:.1f} ms")
    return lines
