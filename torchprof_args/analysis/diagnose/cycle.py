"""One cycle's rank parts, as the cross-rank kinds read them: :class:`CycleRanks`.

The cross-rank kinds (``expert_imbalance``, ``straggler``, ``collective_skew``) work from what each rank's
:class:`~.documents.RankDiagnosis` keeps (steps, collective records), never from a trace, so 512
ranks are diagnosed from their sidecars.  The view matches the ranks' collectives once
(:func:`~torchprof_args.analysis.analyzers.collective_match.match_collectives`) for both kinds,
after putting every host's times on one clock (:mod:`~torchprof_args.analysis.analyzers.clocks`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from functools import cached_property
from typing import cast

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment, aligned_comms
from torchprof_args.analysis.analyzers.clocks import align_clocks
from torchprof_args.analysis.analyzers.collective_match import (
    CollectiveInstance,
    CollectivesReport,
    match_collectives,
)
from torchprof_args.analysis.analyzers.collectives import P2P_KINDS, CommRecord, CompactRecords
from torchprof_args.analysis.diagnose.documents import RankDiagnosis
from torchprof_args.analysis.intervals import merge_intervals, total
from torchprof_args.analysis.memory.categories import MemoryPart

__all__ = ["CycleRanks", "union_us"]


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length (us) of the union of ``(start, end)`` pairs."""
    if not intervals:
        return 0.0
    starts, ends = merge_intervals(np.array([a for a, _ in intervals]), np.array([b for _, b in intervals]))
    return total((starts, ends))


def align_clocks_of(parts: Sequence[RankDiagnosis], apply: bool = True) -> ClockAlignment:
    """The hosts' clocks of one cycle's rank parts (each with its rank)."""
    return align_clocks([p.comms(cast(int, p.rank)) for p in parts], apply=apply)


def on_reference_clock(part: RankDiagnosis, clock: ClockAlignment) -> RankDiagnosis:
    """``part`` with its base time and collective records on the reference host's clock."""
    rank = cast(int, part.rank)
    if clock.host_of(rank) is None or not clock.aligned:
        return part
    comms = aligned_comms(part.comms(rank), clock)
    first = part.steps[0].start_us if part.steps else 0.0
    return msgspec.structs.replace(part, base_us=part.base_us + clock.offset_us(rank, part.base_us + first),
                                   collectives=CompactRecords.of(comms.records))


class CycleRanks:
    """One cycle's rank parts, each with its rank (the part's, else its position), and what the
    cross-rank kinds derive from them, computed once.

    Args:
        parts: the ranks' parts, in input order.
        memory: the ranks' memory parts (their sidecars' ``memory``), when read; ``memory_imbalance``
            compares them.
        align_clocks: whether the hosts' clocks are aligned (:attr:`clock`; False: estimated, not
            applied).
    """

    def __init__(self, parts: Sequence[RankDiagnosis], memory: Sequence[MemoryPart] = (), *,
                 align_clocks: bool = True) -> None:
        self.memory: tuple[MemoryPart, ...] = tuple(memory)
        numbered = [p if isinstance(p.rank, int) else msgspec.structs.replace(p, rank=i)
                    for i, p in enumerate(parts)]
        #: the hosts' clocks: each part's times are on the reference host's clock when aligned.
        self.clock: ClockAlignment = align_clocks_of(numbered, align_clocks)
        self.parts: tuple[RankDiagnosis, ...] = tuple(on_reference_clock(p, self.clock) for p in numbered)
        means = [p.step_mean_us for p in self.parts if p.step_mean_us]
        #: the job's step: the slowest rank's mean step (the pace the job advances at).
        self.step_ms: float | None = max(means) / 1e3 if means else None

    @staticmethod
    def rank_of(part: RankDiagnosis) -> int:
        """The rank of one of :attr:`parts` (each has one here)."""
        return cast(int, part.rank)

    @property
    def n_steps(self) -> int:
        """Steps in the cycle: the most any rank has (at least 1)."""
        return max((len(p.steps) for p in self.parts), default=1)

    @property
    def base_us(self) -> dict[int, float]:
        """Each rank's trace base time (us)."""
        return {self.rank_of(p): p.base_us for p in self.parts}

    @cached_property
    def match(self) -> CollectivesReport | None:
        """The ranks' collectives matched (``torchprof collectives``' report); None when fewer than
        two ranks have collective records."""
        comms = [p.comms(self.rank_of(p)) for p in self.parts]
        if sum(1 for c in comms if c.records) < 2:
            return None
        return match_collectives(comms, top=5, members=self.members)

    @cached_property
    def members(self) -> dict[int, dict[int, CommRecord]]:
        """Each matched instance's records (instance id -> rank -> record), filled by :attr:`match`."""
        return {}

    @cached_property
    def matched(self) -> list[CollectiveInstance]:
        """The matched instances seen by two or more ranks, point-to-point transfers left out (their
        waits are a pipeline's bubble, not a late rank)."""
        if self.match is None:
            return []
        return [i for i in self.match["instances"] if i["ranks"] > 1 and i["kind"] not in P2P_KINDS]

    @cached_property
    def waited_us(self) -> dict[int, float] | None:
        """Per rank, the time it waited in collectives for the last rank to arrive: the union of its
        [own arrival, last arrival] intervals (collectives that overlap, like DDP's buckets, count
        once); None without matched collectives."""
        if not self.matched:
            return None
        per_rank: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for inst in self.matched:
            last = inst["first_start_us"] + inst["skew_us"]
            for rank, offset in inst["arrival_offset_us"].items():
                if inst["skew_us"] > offset:
                    per_rank[int(rank)].append((inst["first_start_us"] + offset, last))
        return {rank: union_us(iv) for rank, iv in per_rank.items()}

    @cached_property
    def work_ms(self) -> dict[int, float]:
        """Each timed rank's work per step (ms): its mean step minus the time it waited in collectives
        for the last rank (:attr:`waited_us`); without matched collectives, its own steps' time outside
        collectives.  ``straggler`` and ``expert_imbalance`` compare it."""
        waits = self.waited_us
        out = {}
        for part in self.parts:
            if not part.steps:
                continue
            rank = self.rank_of(part)
            if waits is None:
                us = statistics.fmean(s.work_us for s in part.steps)
            else:
                step_us = statistics.fmean(s.dur_us for s in part.steps)
                us = max(step_us - waits.get(rank, 0.0) / len(part.steps), 0.0)
            out[rank] = us / 1e3
        return out
