"""Every collective of one profiled cycle matched across ranks (``torchprof collectives``): each
rank's collectives as its diagnosis part keeps them (from its sidecar, else its trace parsed: the
per-trace pipeline, :mod:`~torchprof_args.analysis.collect`), matched across ranks
(:mod:`~torchprof_args.analysis.analyzers.collective_match` says how instances are matched).
Rendered by :mod:`~torchprof_args.analysis.render.collectives`."""

from __future__ import annotations

from collections.abc import Sequence

from torchprof_args.analysis.analyzers.clock_alignment import aligned_comms
from torchprof_args.analysis.analyzers.clocks import align_clocks as align_clocks_of
from torchprof_args.analysis.analyzers.collective_match import CycleCollectives, match_collectives
from torchprof_args.analysis.analyzers.collectives import RankComms
from torchprof_args.analysis.collect.trace_results import TraceResults
from torchprof_args.errors import TraceError

__all__ = ["collectives_report"]


def collectives_report(results: Sequence[TraceResults | None], cycle: str | None, top: int = 20,
                       align_clocks: bool = True) -> CycleCollectives:
    """Match one cycle's collectives across its ranks.

    Args:
        results: the cycle's traces' results with their ``diagnosis`` part, in input order (None:
            a trace that failed, left out).
        cycle: which cycle they are (``iterations A-B``), or None.
        top: worst-skew instances listed.
        align_clocks: whether the hosts' clocks are aligned first (False: estimated and said, not
            applied).

    Returns:
        ``match_collectives``' report and which cycle was read.  Raises
        :class:`~torchprof_args.errors.TraceError` on two traces of one rank.
    """
    ranks: dict[int, RankComms] = {}
    for index, found in enumerate(results):
        if found is None or found.diagnosis is None:
            continue
        rank = index if found.diagnosis.rank is None else found.diagnosis.rank
        if rank in ranks:
            raise TraceError(f"{found.path}: a second trace of rank {rank} (also {ranks[rank].file}); give "
                             "one cycle's traces (--cycle picks one in a directory)")
        ranks[rank] = found.diagnosis.comms(rank, str(found.path))
    clock = align_clocks_of(list(ranks.values()), apply=align_clocks)
    aligned = [aligned_comms(rc, clock) for rc in ranks.values()]
    return {**match_collectives(aligned, top=top), "cycle": cycle, "clock": clock}
