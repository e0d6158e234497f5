"""The cross-rank view: which rank is slowest, and by how much, from per-rank summaries."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["cross_rank"]


def cross_rank(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time per rank, the slowest rank and the spread, for a directory of per-rank traces.

    ``summaries`` are :func:`~torchprof_args.analysis.summary.summarize` results (a summary
    without a rank takes its position).  ``spread_pct`` is (slowest - fastest) mean step time
    as a percentage of the mean over ranks; ranks without steps are listed but not compared.
    """
    rows = [_rank_row(i, s) for i, s in enumerate(summaries)]
    timed = [r for r in rows if r["step_mean_us"] is not None]
    out: dict[str, Any] = {"ranks": rows, "slowest_rank": None, "fastest_rank": None, "spread_pct": None}
    if timed:
        slow = max(timed, key=lambda r: r["step_mean_us"])
        fast = min(timed, key=lambda r: r["step_mean_us"])
        mean = float(np.mean([r["step_mean_us"] for r in timed]))
        out.update(
            slowest_rank=slow["rank"],
            fastest_rank=fast["rank"],
            step_mean_us=mean,
            spread_pct=100.0 * (slow["step_mean_us"] - fast["step_mean_us"]) / mean if mean > 0 else 0.0,
        )
    return out


def _rank_row(index: int, summary: dict[str, Any]) -> dict[str, Any]:
    gpu = summary["gpu"] or {}
    return {
        "rank": summary["rank"] if summary["rank"] is not None else index,
        "file": summary["file"],
        "step_mean_us": summary["step_mean_us"],
        "steps": len(summary["steps"]),
        "idle_pct": gpu.get("idle_pct"),
        "comm_comp_overlap_pct": gpu.get("comm_comp_overlap_pct"),
    }
