"""``torchprof mem``'s document: one cycle's memory diagnosis (``--json``, schema version 1).

From each rank's memory part (:class:`~.categories.MemoryPart`, from its sidecar or parsed) and any
snapshots (:class:`~.timer_snapshot.SnapshotSummary`): the ranks' peaks, the highest peak explained (when,
by category, by site), its step and timeline, the outlier ranks, the OOM explained, and the findings
ranked by the bytes they would free.  docs/guides/out-of-memory.md documents every field.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from torchprof_args.analysis.memory.allocator import AllocatorView
from torchprof_args.analysis.memory.categories import (
    ByCategory,
    MemoryPart,
    Moment,
    Site,
    StepMemory,
    Timeline,
    human_bytes,
)
from torchprof_args.analysis.memory.findings import MIN_FINDING_BYTES, REMEDIES, MemoryFinding, findings_of
from torchprof_args.analysis.memory.oom import OomExplanation
from torchprof_args.analysis.memory.ranks import Outlier, RankMemory, outliers, rank_rows
from torchprof_args.analysis.memory.snapshot import SnapshotSummary

__all__ = ["MEMORY_REPORT_VERSION", "IMBALANCE_REMEDY", "MemoryReport", "CyclePeak", "data_parallel_size",
           "memory_report"]

#: the ``version`` of ``torchprof mem --json`` (bumped on any incompatible change).
MEMORY_REPORT_VERSION = 1
IMBALANCE_REMEDY = ("find what the rank keeps that the others free (its top sites: torchprof mem on its "
                    "trace)")
STAGE_REMEDY = ("balance the pipeline stages: give stage {stage} fewer layers (Megatron "
                "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers)")


class CyclePeak(msgspec.Struct, frozen=True):
    """The highest peak of the cycle (the rank that runs out first) and what made it."""

    bytes: int
    rank: int | None
    device: str
    when: Moment
    by_category: ByCategory
    category_peaks: ByCategory
    top_sites: list[Site]
    source: str
    notes: list[str]


class MemoryReport(msgspec.Struct, frozen=True):
    """``torchprof mem --json``.

    Attributes:
        version: :data:`MEMORY_REPORT_VERSION`.
        path: the path given.
        cycle: which profiled cycle (``iterations A-B``), None for snapshots alone.
        ranks: each rank's peak.
        peak: the highest peak, explained (None without ``[memory]`` events).
        steps: the peak rank's steps.
        timeline: the peak rank's live bytes by category over the window.
        outliers: ranks holding more than the median.
        snapshots: each snapshot read.
        oom: the OOM explained (the first snapshot with an ``oom`` entry).
        allocator: every rank's CUDA allocator peaks from the run's metrics.jsonl (None without).
        findings: what would free memory, largest first.
        errors: inputs that could not be read, one line each.
    """

    version: int
    path: str
    cycle: str | None
    ranks: list[RankMemory]
    peak: CyclePeak | None
    steps: list[StepMemory]
    timeline: Timeline | None
    outliers: list[Outlier]
    snapshots: list[SnapshotSummary]
    oom: OomExplanation | None
    allocator: AllocatorView | None
    findings: list[MemoryFinding]
    errors: list[str]


def data_parallel_size(parts: Sequence[MemoryPart]) -> int:
    """The data-parallel ranks sharding would spread over: distinct ``dp`` coordinates when recorded,
    else the world size, else the ranks given."""
    dps = {p.coordinates["dp"] for p in parts if p.coordinates and "dp" in p.coordinates}
    if len(dps) > 1:
        return len(dps)
    sizes = [p.world_size for p in parts if p.world_size]
    return max(sizes) if sizes else max(1, len(parts))


def _merge(findings: list[MemoryFinding]) -> list[MemoryFinding]:
    """One finding per kind (and site): the worst rank's, naming every rank that has it."""
    groups: dict[tuple[str, object], list[MemoryFinding]] = {}
    for f in findings:
        groups.setdefault((f.kind, f.evidence.get("site")), []).append(f)
    merged = []
    for group in groups.values():
        worst = max(group, key=lambda f: f.bytes_freed)
        ranks = sorted({r for f in group for r in f.ranks})
        merged.append(msgspec.structs.replace(worst, ranks=ranks) if len(group) > 1 else worst)
    return sorted(merged, key=lambda f: (-f.bytes_freed, f.kind))


def memory_report(path: str, cycle: str | None, parts: Sequence[tuple[str, MemoryPart]],
                  snapshots: Sequence[SnapshotSummary] = (), errors: Sequence[str] = (),
                  allocator: AllocatorView | None = None) -> MemoryReport:
    """The memory diagnosis of one cycle's ranks and the snapshots given.

    Args:
        path: the path given (for the document).
        cycle: the cycle's label, or None.
        parts: ``(trace file, memory part)`` per rank.
        snapshots: snapshots read (an OOM snapshot's explanation is the report's ``oom``).
        errors: inputs that could not be read.
        allocator: the ranks' allocator peaks from the run's metrics.jsonl.

    Returns:
        The document.
    """
    rows = rank_rows(parts)
    dp = data_parallel_size([p for _, p in parts])
    findings: list[MemoryFinding] = []
    best: tuple[int, MemoryPart] | None = None
    for _, part in parts:
        if part.devices:
            rank = part.rank
            findings += findings_of(part.devices[0], rank, dp, part.fsdp2)
            if best is None or part.devices[0].peak_bytes > best[1].devices[0].peak_bytes:
                best = (rank if rank is not None else -1, part)
    found_outliers = outliers(rows)
    findings += [MemoryFinding("rank_imbalance", o.over_median_bytes, o.summary,
                               IMBALANCE_REMEDY if o.stage is None else STAGE_REMEDY.format(stage=o.stage),
                               "what the rank holds over the median rank", [o.rank],
                               {"category": o.category, "median_bytes": o.median_bytes, "stage": o.stage})
                 for o in found_outliers if o.over_median_bytes >= MIN_FINDING_BYTES]
    for snap in snapshots:
        for state in snap.devices:
            if state.cached_free_bytes >= MIN_FINDING_BYTES and state.fragmentation_pct > 0:
                findings.append(MemoryFinding(
                    "fragmentation", state.cached_free_bytes,
                    f"{snap.path}: cuda:{state.device} caches {human_bytes(state.cached_free_bytes)} of "
                    f"free blocks, the largest {human_bytes(state.largest_free_block_bytes)} "
                    f"({state.fragmentation_pct:.0f} % unusable as one block)", REMEDIES["fragmentation"],
                    "the free memory the allocator caches at the snapshot", [],
                    {"snapshot": snap.path, "expandable_segments": state.expandable_segments}))
    peak = None
    steps: list[StepMemory] = []
    timeline = None
    if best is not None:
        rank, part = best
        device = part.devices[0]
        peak = CyclePeak(bytes=device.peak_bytes, rank=part.rank, device=device.device, when=device.peak,
                    by_category=device.by_category, category_peaks=device.category_peaks,
                    top_sites=device.top_sites, source=part.source, notes=part.notes)
        steps, timeline = device.steps, device.timeline
    oom = next((s.oom for s in snapshots if s.oom is not None), None)
    if oom is not None:
        findings += [MemoryFinding(
            r.kind, r.bytes_freed, f"at the OOM ({oom.device}): frees {human_bytes(r.bytes_freed)}, "
            + ("enough" if r.enough else "not enough") + f" ({human_bytes(oom.missing_bytes)} were missing)",
            r.remedy, "what it frees of what held the memory at the OOM", [], {"enough": r.enough})
            for r in oom.remedies[1:] if r.bytes_freed >= MIN_FINDING_BYTES]
    return MemoryReport(version=MEMORY_REPORT_VERSION, path=path, cycle=cycle, ranks=rows, peak=peak,
                        steps=steps, timeline=timeline, outliers=found_outliers, snapshots=list(snapshots),
                        oom=oom, allocator=allocator, findings=_merge(findings), errors=list(errors))
