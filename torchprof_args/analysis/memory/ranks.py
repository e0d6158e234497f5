"""Memory across ranks: each rank's peak from its sidecar, and the ranks that hold more than the rest.

Ranks of one job should peak alike, except where the parallel layout says otherwise (pipeline stage 0
keeps the most micro-batches' activations in flight under 1F1B).  A rank whose peak is over the
median of all ranks by :data:`OUTLIER_SHARE` (and :data:`OUTLIER_MIN_BYTES`) is named, with its
pipeline stage and parallel coordinates when its trace records them, and the category that makes the
difference.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import msgspec

from torchprof_args.analysis.memory.categories import MEMORY_CATEGORIES, ByCategory, MemoryPart, human_bytes

__all__ = ["OUTLIER_MIN_BYTES", "OUTLIER_SHARE", "Outlier", "RankMemory", "outliers", "rank_rows"]

#: a rank is an outlier when its peak is this share over the median ...
OUTLIER_SHARE = 0.05
#: ... and at least this many bytes over it.
OUTLIER_MIN_BYTES = 1 << 20


class RankMemory(msgspec.Struct, frozen=True):
    """One rank's peak (its busiest device's) and where it stands in the job."""

    rank: int
    file: str
    source: str
    device: str | None
    peak_bytes: int
    phase: str | None
    by_category: ByCategory
    stage: int | None
    coordinates: dict[str, int] | None


class Outlier(msgspec.Struct, frozen=True):
    """A rank holding more than the others: by how much, and in which category most."""

    rank: int
    peak_bytes: int
    median_bytes: int
    over_median_bytes: int
    category: str
    category_over_median_bytes: int
    stage: int | None
    coordinates: dict[str, int] | None
    summary: str


def rank_rows(parts: Sequence[tuple[str, MemoryPart]]) -> list[RankMemory]:
    """Each trace's rank row (``(file, part)``; a part without a rank is numbered by its position)."""
    rows = []
    for position, (file, part) in enumerate(parts):
        device = part.devices[0] if part.devices else None
        rows.append(RankMemory(
            rank=part.rank if part.rank is not None else position, file=file, source=part.source,
            device=device.device if device else None, peak_bytes=device.peak_bytes if device else 0,
            phase=device.peak.phase if device else None,
            by_category=device.by_category if device else ByCategory(), stage=part.stage,
            coordinates=part.coordinates))
    return sorted(rows, key=lambda r: r.rank)


def _where(row: RankMemory) -> str:
    bits = [] if row.stage is None else [f"pipeline stage {row.stage}"]
    if row.coordinates:
        bits.append(" ".join(f"{axis}={index}" for axis, index in row.coordinates.items()))
    return f" ({', '.join(bits)})" if bits else ""


def outliers(rows: Sequence[RankMemory]) -> list[Outlier]:
    """The ranks whose peak stands over the median (largest excess first); none with one rank."""
    measured = [r for r in rows if r.device is not None]
    if len(measured) < 2:
        return []
    median = statistics.median(r.peak_bytes for r in measured)
    per_category = [statistics.median(r.by_category.values()[c] for r in measured)
                    for c in range(len(MEMORY_CATEGORIES))]
    found = []
    for row in measured:
        over = row.peak_bytes - median
        if over < OUTLIER_MIN_BYTES or row.peak_bytes < median * (1 + OUTLIER_SHARE):
            continue
        excess = [v - m for v, m in zip(row.by_category.values(), per_category, strict=True)]
        worst = max(range(len(MEMORY_CATEGORIES)), key=lambda c: excess[c])
        found.append(Outlier(
            rank=row.rank, peak_bytes=row.peak_bytes, median_bytes=int(median), over_median_bytes=int(over),
            category=MEMORY_CATEGORIES[worst], category_over_median_bytes=int(excess[worst]), stage=row.stage,
            coordinates=row.coordinates,
            summary=f"rank {row.rank}{_where(row)} peaks at {human_bytes(row.peak_bytes)}, "
                    f"{human_bytes(over)} over the median of {len(measured)} ranks, mostly "
                    f"{MEMORY_CATEGORIES[worst].replace('_', ' ')} (+{human_bytes(excess[worst])})"))
    return sorted(found, key=lambda o: -o.over_median_bytes)
