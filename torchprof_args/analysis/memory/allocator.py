"""Every rank's CUDA allocator peaks from ``metrics.jsonl``: the ranks no trace covers.

The metrics writer gathers each rank's allocator readings every log interval in its one all-gather
(:mod:`torchprof_args.capture.metrics.hardware`: ``memory/max-allocated-gb``, ``memory/max-reserved-gb``,
``memory/fragmentation-gb``, ``memory/alloc-retries``, peaks since the job started) and keeps them per
rank in ``metrics.jsonl``'s ``per_rank``.  :func:`allocator_view` reads the latest record that has
them: every rank's peak, even where only a few ranks trace, and the ranks over the median (the same
rule as :mod:`.ranks`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import msgspec

from torchprof_args.analysis.memory.categories import human_bytes
from torchprof_args.analysis.memory.ranks import OUTLIER_MIN_BYTES, OUTLIER_SHARE

__all__ = ["ALLOCATOR_KEYS", "AllocatorRank", "AllocatorView", "allocator_view"]

GIB = float(2**30)
#: the per-rank allocator series of metrics.jsonl, by this view's field names.
ALLOCATOR_KEYS = {
    "max_allocated_bytes": "memory/max-allocated-gb",
    "max_reserved_bytes": "memory/max-reserved-gb",
    "fragmentation_bytes": "memory/fragmentation-gb",
}


class AllocatorRank(msgspec.Struct, frozen=True):
    """One rank's allocator peaks since the job started (None: the rank sent no reading)."""

    rank: int
    max_allocated_bytes: int | None
    max_reserved_bytes: int | None
    fragmentation_bytes: int | None
    alloc_retries: int | None


class AllocatorView(msgspec.Struct, frozen=True):
    """The allocator peaks of every rank at one logged iteration, and the ranks over the median."""

    file: str
    iteration: int
    ranks: list[AllocatorRank]
    outliers: list[int]
    summary: str


def _bytes(values: list[object] | None, rank: int) -> int | None:
    value = values[rank] if values is not None and rank < len(values) else None
    return int(value * GIB) if isinstance(value, (int, float)) else None


def allocator_view(path: str | Path) -> AllocatorView | None:
    """The latest allocator readings of ``path`` (a metrics.jsonl); None without any (no CUDA, or
    no such file).  Lines that are not JSON records are skipped."""
    latest = None
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                per_rank = record.get("per_rank") if isinstance(record, dict) else None
                if isinstance(per_rank, dict) and isinstance(
                    per_rank.get(ALLOCATOR_KEYS["max_allocated_bytes"]), list
                ):
                    latest = record
    except OSError:
        return None
    if latest is None:
        return None
    per_rank = latest["per_rank"]
    series = {field: per_rank.get(key) for field, key in ALLOCATOR_KEYS.items()}
    retries = per_rank.get("memory/alloc-retries")
    ranks = [
        AllocatorRank(
            rank,
            max_allocated_bytes=_bytes(series["max_allocated_bytes"], rank),
            max_reserved_bytes=_bytes(series["max_reserved_bytes"], rank),
            fragmentation_bytes=_bytes(series["fragmentation_bytes"], rank),
            alloc_retries=int(retries[rank])
            if isinstance(retries, list) and rank < len(retries) and isinstance(retries[rank], (int, float))
            else None,
        )
        for rank in range(len(series["max_allocated_bytes"] or []))
    ]
    measured = [r for r in ranks if r.max_allocated_bytes is not None]
    median = statistics.median(r.max_allocated_bytes or 0 for r in measured) if measured else 0
    over = [
        r.rank
        for r in measured
        if (r.max_allocated_bytes or 0) - median >= OUTLIER_MIN_BYTES
        and (r.max_allocated_bytes or 0) >= median * (1 + OUTLIER_SHARE)
    ]
    peaks = [r.max_allocated_bytes or 0 for r in measured]
    summary = (
        f"allocator peaks of {len(measured)} ranks at iteration {latest.get('iteration')}: "
        f"{human_bytes(min(peaks, default=0))} .. {human_bytes(max(peaks, default=0))} allocated"
        + (f"; over the median: rank(s) {', '.join(map(str, over[:16]))}" if over else "")
    )
    return AllocatorView(
        file=str(path),
        iteration=int(latest.get("iteration") or 0),
        ranks=ranks,
        outliers=over,
        summary=summary,
    )
