"""The text of ``torchprof critical-path``: per step, the path's length beside the step's, its time
by rank and by category; then the operators and kernels with the most time on the path, the
what-ifs' answers and what the graph could not use."""

from __future__ import annotations

from typing import Any

__all__ = ["format_critical_path", "path_line"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _shares(values: dict[str, float], total: float, limit: int) -> str:
    ranked = sorted(values.items(), key=lambda kv: -kv[1])[:limit]
    return ", ".join(f"{k.replace('_', ' ')} {v:.1f} ({100 * v / total:.0f} %)" if total > 0 else k
                     for k, v in ranked)


def path_line(step: dict[str, Any]) -> str:
    """One step's path in one line: the step, its path and the difference, by category."""
    ranks = step["by_rank"]
    where = f"rank {next(iter(ranks))}" if len(ranks) == 1 else f"{len(ranks)} ranks"
    return (f"{step['step']}: step {_ms(step['step_ms'])} (rank {step['rank']}), path {_ms(step['path_ms'])} "
            f"(difference {step['difference_ms']:+.2f} ms) on {where}: "
            f"{_shares(step['by_category'], step['path_ms'], 4)}")


def format_critical_path(doc: dict[str, Any], rows: int = 5) -> str:
    """The text ``torchprof critical-path`` prints.

    Args:
        doc: :func:`~torchprof_args.analysis.critical_path.job.critical_path`'s document as JSON
            values (docs/guides/critical-path.md).
        rows: operators and kernels listed.

    Returns:
        The text, without a final newline.
    """
    head = (f"torchprof critical-path: {doc['ranks']} rank{'s' if doc['ranks'] != 1 else ''}, step "
            f"{_ms(doc['step_ms'])}" + (f", {doc['cycle']}" if doc.get("cycle") else ""))
    lines = [head]
    for step in doc["steps"]:
        lines.append("  " + path_line(step))
        if len(step["by_rank"]) > 1:
            lines.append(f"    by rank: {_shares(step['by_rank'], step['path_ms'], 6)}")
    if doc["top"]:
        lines.append("on the path, per step:")
        for entry in doc["top"][:rows]:
            site = f" at {entry['site']}" if entry.get("site") else ""
            lines.append(f"  {entry['ms_per_step']:8.2f} ms  rank {entry['rank']}  {entry['category'].replace('_', ' ')}"
                         f"  {entry['name'][:90]}{site}")
    for answer in doc.get("what_if") or []:
        lines.append(f"what if {answer['spec']}: step {_ms(answer['step_ms'])}, saves "
                     f"{_ms(answer['saving_ms_per_step'])}/step ({answer['how']})")
    lines += [f"  note: {note}" for note in doc.get("notes") or []]
    return "\n".join(lines)
