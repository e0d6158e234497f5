"""The cross-rank view of one cycle: distributions over ranks, the slowest and fastest ranks.

Built from per-rank summaries (sidecars or parsed traces), so it costs nothing per event: 1,024
ranks take milliseconds.  For each rank: its mean step time, each step's time (the heatmap),
GPU idle / compute and communication/computation overlap (HTA definitions), where it runs (host,
parallel coordinates).  Over ranks: min / p50 / p90 / max of step time, idle and overlap; the k
slowest and fastest ranks; stragglers (mean step more than ``straggler_pct`` above the median).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DISTRIBUTION_KEYS", "STRAGGLER_PCT", "cross_rank", "distribution"]

#: the per-rank figures whose distribution over ranks the view reports.
DISTRIBUTION_KEYS = ("step_mean_us", "idle_pct", "comm_comp_overlap_pct")
#: a rank whose mean step is this much (%) above the median rank's is a straggler.
STRAGGLER_PCT = 5.0


def distribution(values: list[float | None]) -> dict[str, float | int | None]:
    """min / p50 / p90 / max / mean of the values that are not None, and how many there were."""
    data = np.array([v for v in values if v is not None], dtype=np.float64)
    if len(data) == 0:
        return {"n": 0, "min": None, "p50": None, "p90": None, "max": None, "mean": None}
    p50, p90 = np.percentile(data, [50, 90])
    return {"n": int(len(data)), "min": float(data.min()), "p50": float(p50), "p90": float(p90),
            "max": float(data.max()), "mean": float(data.mean())}


def cross_rank(summaries: list[dict[str, Any]], k: int = 5,
               straggler_pct: float = STRAGGLER_PCT) -> dict[str, Any]:
    """The view of one cycle's per-rank summaries (:func:`~torchprof_args.analysis.summary.summarize`
    results; a summary without a rank takes its position).

    ``ranks`` has every rank's row, sorted by rank; ``slowest`` / ``fastest`` the ``k`` ranks with
    the longest / shortest mean step; ``spread_pct`` is (slowest - fastest) as a percentage of the
    mean over ranks.  Ranks without steps are listed but not compared.
    """
    rows = sorted((_rank_row(i, s) for i, s in enumerate(summaries)), key=lambda r: (r["rank"], r["file"]))
    timed = [r for r in rows if r["step_mean_us"] is not None]
    by_time = sorted(timed, key=lambda r: (-r["step_mean_us"], r["rank"]))
    dists = {key: distribution([r[key] for r in rows]) for key in DISTRIBUTION_KEYS}
    median = dists["step_mean_us"]["p50"]
    for r in rows:
        r["vs_median_pct"] = (100.0 * (r["step_mean_us"] / median - 1.0)
                              if r["step_mean_us"] is not None and median else None)
    out: dict[str, Any] = {
        "ranks": rows,
        "distributions": dists,
        "steps": _step_names(rows),
        "slowest": by_time[:k],
        "fastest": by_time[::-1][:k],
        "stragglers": [r for r in by_time
                       if r["vs_median_pct"] is not None and r["vs_median_pct"] > straggler_pct],
        "straggler_pct": straggler_pct,
        "slowest_rank": None, "fastest_rank": None, "spread_pct": None, "step_mean_us": None,
    }
    if timed:
        mean = dists["step_mean_us"]["mean"]
        slow, fast = by_time[0], by_time[-1]
        out.update(slowest_rank=slow["rank"], fastest_rank=fast["rank"], step_mean_us=mean,
                   spread_pct=100.0 * (slow["step_mean_us"] - fast["step_mean_us"]) / mean if mean else 0.0)
    return out


def _rank_row(index: int, summary: dict[str, Any]) -> dict[str, Any]:
    gpu = summary.get("gpu") or {}
    steps = summary.get("steps") or []
    return {
        "rank": summary["rank"] if summary.get("rank") is not None else index,
        "file": summary["file"],
        "host": summary.get("host"),
        "parallel": summary.get("parallel"),
        "steps": len(steps),
        "step_us": {s["name"]: s["dur_us"] for s in steps},
        "step_mean_us": summary.get("step_mean_us"),
        "idle_pct": gpu.get("idle_pct"),
        "compute_pct": gpu.get("compute_pct"),
        "comm_comp_overlap_pct": gpu.get("comm_comp_overlap_pct"),
    }


def _step_names(rows: list[dict[str, Any]]) -> list[str]:
    """Every step name of the cycle, in ``ProfilerStep#N`` order."""
    names = {name for r in rows for name in r["step_us"]}

    def number(name: str) -> tuple[int, str]:
        tail = name.rsplit("#", 1)[-1]
        return (int(tail), name) if tail.isdigit() else (1 << 62, name)

    return sorted(names, key=number)
