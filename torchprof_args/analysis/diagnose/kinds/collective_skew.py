"""``collective_skew``: ranks that arrive late at collectives, which the other ranks wait for.

From the collectives matcher (:mod:`.collective_match`): for each collective seen by two or more
ranks, the arrival skew is the last rank's start minus the first's; every other rank waits in the
collective for that long at most.  Per step, the job loses the union of the instances' [first
arrival, last arrival] intervals (collectives that overlap, like DDP's gradient buckets, count
once).  Point-to-point transfers (send / recv) are left out: their waits are a pipeline's bubble
(``pipeline_bubble``), not a late rank.  The ranks named are those that arrived last in the
instances that caused at least :data:`LATE_SHARE_MIN_PCT` of the waiting.

It works from each rank's collective records, which the summary sidecar keeps in a compact form
(:func:`compact_records` / :func:`records_from_compact`), so 512 ranks are matched without reading a
trace.  Below :data:`SKEW_MIN_PCT` of the step (or :data:`SKEW_MIN_MS`) it reports nothing: the
skew of healthy ranks is launch jitter.  Ranks on different hosts are compared on their own
clocks: a skew below the hosts' clock offset is noise (the bound says so).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import astuple, fields
from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.collectives import P2P_KINDS, CommRecord
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.intervals import merge_intervals, total

__all__ = ["LATE_SHARE_MIN_PCT", "SKEW_MIN_MS", "SKEW_MIN_PCT", "collective_skew", "compact_records",
           "matched_instances", "records_from_compact", "waited_us"]

#: reported only when the skew per step is above this share of the step (%) ...
SKEW_MIN_PCT = 2.0
#: ... and above this many milliseconds.
SKEW_MIN_MS = 0.5
#: a rank is named when the instances it arrived last at caused this share (%) of the waiting.
LATE_SHARE_MIN_PCT = 10.0

_FIELDS = tuple(f.name for f in fields(CommRecord))


def compact_records(records: Sequence[CommRecord]) -> dict[str, Any]:
    """One rank's collective records as ``{"fields": [...], "rows": [[...], ...]}`` (sidecar form)."""
    return {"fields": list(_FIELDS), "rows": [list(astuple(r)) for r in records]}


def records_from_compact(doc: dict[str, Any] | None) -> list[CommRecord]:
    """The inverse of :func:`compact_records` (fields the reader does not know are dropped)."""
    if not doc:
        return []
    names = doc.get("fields") or []
    known = [i for i, n in enumerate(names) if n in _FIELDS]
    return [CommRecord(**{names[i]: row[i] for i in known}) for row in doc.get("rows") or []]


def _union(intervals: list[tuple[float, float]]) -> float:
    if not intervals:
        return 0.0
    starts, ends = merge_intervals(np.array([a for a, _ in intervals]), np.array([b for _, b in intervals]))
    return total((starts, ends))


def matched_instances(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The matcher's instances seen by two or more ranks, point-to-point transfers left out."""
    return [i for i in report["instances"] if i["ranks"] > 1 and i["kind"] not in P2P_KINDS]


def waited_us(report: dict[str, Any]) -> dict[int, float]:
    """Per rank, the time it waited in collectives for the last rank to arrive: the union of its
    [own arrival, last arrival] intervals (collectives that overlap, like DDP's buckets, count once)."""
    per_rank: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for inst in matched_instances(report):
        last = inst["first_start_us"] + inst["skew_us"]
        for rank, offset in inst["arrival_offset_us"].items():
            if inst["skew_us"] > offset:
                per_rank[int(rank)].append((inst["first_start_us"] + offset, last))
    return {rank: _union(iv) for rank, iv in per_rank.items()}


def collective_skew(report: dict[str, Any], n_steps: int, step_ms: float | None,
                    base_us: dict[int, float] | None = None) -> Finding | None:
    """The collective-skew finding from :func:`~.collective_match.match_collectives`' ``report`` over
    one cycle's ranks, or None.

    ``n_steps``: steps in the cycle (the skew is reported per step); ``step_ms``: the job's step;
    ``base_us``: each rank's trace base time (for the Perfetto timestamp of the worst instance).
    The time lost per step is the union of the instances' [first arrival, last arrival] intervals.
    """
    matched = matched_instances(report)
    if not matched:
        return None
    steps = max(n_steps, 1)
    ms = _union([(i["first_start_us"], i["first_start_us"] + i["skew_us"]) for i in matched]) / steps / 1e3
    if step_ms:
        ms = min(ms, step_ms)
    threshold = max(SKEW_MIN_MS, SKEW_MIN_PCT / 100.0 * (step_ms or 0.0))
    if ms <= threshold:
        return None
    caused: dict[int, float] = defaultdict(float)
    for inst in matched:
        caused[inst["last_rank"]] += inst["skew_us"]
    grand = sum(caused.values()) or 1.0
    late = sorted((r for r, us in caused.items() if 100.0 * us / grand >= LATE_SHARE_MIN_PCT),
                  key=lambda r: -caused[r])
    worst = max(matched, key=lambda i: i["skew_us"])
    base = (base_us or {}).get(worst["last_rank"], 0.0)
    kinds = defaultdict(float)
    for inst in matched:
        kinds[inst["kind"]] += inst["skew_us"] / steps / 1e3
    names = ", ".join(str(r) for r in late[:8]) + (" ..." if len(late) > 8 else "")
    return Finding(
        kind="collective_skew",
        summary=(f"The other ranks wait {ms:.1f} ms per step in collectives for rank(s) {names} to "
                 f"arrive ({len(matched)} collectives over {steps} step(s))."),
        ranks=tuple(late), ms_per_step=ms, share_of_step=ms / step_ms if step_ms else 0.0,
        saving_ms_per_step=ms,
        saving_bound=("the union of the step's arrival skews: what the first ranks wait "
                      "at most (ranks on other hosts are compared on their own clocks)"),
        remedy=("Find why the late rank(s) arrive late (a straggler, uneven work before the collective, "
                "a blocking host operation); `torchprof collectives` lists the instances."),
        evidence={
            "wait_caused_ms_per_step": {str(r): round(caused[r] / steps / 1e3, 3) for r in late[:16]},
            "by_collective_ms_per_step": {k: round(v, 3)
                                          for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "matched_by": report["matched_by"],
            "worst": {"kind": worst["kind"], "pg": worst["pg"], "step": worst["step"],
                      "skew_ms": round(worst["skew_us"] / 1e3, 3), "last_rank": worst["last_rank"]},
            "perfetto_rank": worst["last_rank"],
            "perfetto_ts_us": worst["first_start_us"] + worst["skew_us"] - base,
        },
    )
