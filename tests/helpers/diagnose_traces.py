"""Copies of real traces with a cross-rank problem injected, for ``torchprof diagnose``'s tests.

The injection is one operation on a trace's events, :func:`insert_time`: X us of time inserted at
``t0`` (what starts at or after it moves X later; what spans it lasts X longer).  A straggler in a
pair of real ranks is then what a real job would record: the slow rank gets X of extra work at the
start of each step, the other rank waits X longer in its first collective of that step.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from helpers.paths import DATA

__all__ = ["CPU_PAIR", "GPU_PAIR", "insert_time", "late_pair", "load_events", "straggler_pair",
           "write_events"]

#: two real ranks of one job: a 128-GPU NCCL job's ranks 0 and 1, and tests/jobs/diagnose_job.py's
#: 2-rank gloo DDP job without a problem.
GPU_PAIR = ("gpu_128rank_sampled_rank0.json.gz", "gpu_128rank_sampled_rank1.json.gz")
CPU_PAIR = ("cpu_2rank_ddp_rank0.json.gz", "cpu_2rank_ddp_rank1.json.gz")


def load_events(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as handle:
        return json.load(handle)


def write_events(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        json.dump(doc, handle)
    return path


def insert_time(doc: dict[str, Any], t0: float, x_us: float) -> None:
    """Insert ``x_us`` of time at ``t0`` into every event of ``doc`` (in place)."""
    for event in doc["traceEvents"]:
        ts = event.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        if ts >= t0:
            event["ts"] = ts + x_us
        elif isinstance(event.get("dur"), (int, float)) and ts + event["dur"] > t0:
            event["dur"] += x_us


def _steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(
        "ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
    return sorted(spans, key=lambda e: e["ts"])


def _is_collective(event: dict[str, Any]) -> bool:
    name = str(event.get("name", ""))
    return (event.get("cat") == "kernel" and "nccl" in name.lower()) or name.startswith("gloo:")


def _first_collective(doc: dict[str, Any], lo: float, hi: float) -> float | None:
    starts = [e["ts"] for e in doc["traceEvents"] if lo <= e.get("ts", -1) < hi and _is_collective(e)]
    return min(starts) if starts else None


def _work_point(doc: dict[str, Any], lo: float, hi: float) -> float:
    """The first operator start in [lo, hi) while no collective runs: where extra work goes."""
    busy = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in doc["traceEvents"]
            if _is_collective(e) and isinstance(e.get("ts"), (int, float))]
    for ts in sorted(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and lo < e["ts"] < hi):
        if not any(s <= ts < e for s, e in busy):
            return ts
    return lo + 1


def straggler_pair(dst: Path, x_us: float, slow: int = 1, pair: tuple[str, str] = GPU_PAIR,
                   late_only: bool = False) -> list[Path]:
    """A real pair of ranks (:data:`GPU_PAIR`, :data:`CPU_PAIR`) in ``dst`` with rank ``slow`` doing
    ``x_us`` more work per step (and the other rank waiting that long in its first collective of each
    step); ``x_us=0``: unmodified.  ``late_only``: rank ``slow`` does no more work but starts each step
    ``x_us`` late (the time goes *between* its steps, e.g. a host pause after ``prof.step()``), so it
    arrives late at the step's first collective: skew without a straggler."""
    out = []
    for rank, name in enumerate(pair):
        doc = load_events(DATA / name)
        steps = _steps(doc)
        points = []
        for i, step in enumerate(steps):
            hi = steps[i + 1]["ts"] if i + 1 < len(steps) else step["ts"] + step["dur"]
            if rank == slow:
                at = step["ts"] if late_only else _work_point(doc, step["ts"], hi)
            else:
                at = _first_collective(doc, step["ts"], hi)
            if at is not None and x_us:
                points.append(at + (1 if rank != slow else 0))
        for t0 in sorted(points, reverse=True):
            insert_time(doc, t0, x_us)
        out.append(write_events(doc, dst / name))
    return out


def late_pair(dst: Path, x_us: float, late: int = 1, pair: tuple[str, str] = CPU_PAIR) -> list[Path]:
    """:func:`straggler_pair` with ``late_only``: rank ``late`` arrives ``x_us`` late at each step."""
    return straggler_pair(dst, x_us, slow=late, pair=pair, late_only=True)
