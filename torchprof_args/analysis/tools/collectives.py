"""Every collective of one profiled cycle matched across ranks (``torchprof collectives``): load
the cycle's traces (files or folders, :mod:`~torchprof_args.analysis.collect.discover`), take
each rank's collectives and match them
(:mod:`~torchprof_args.analysis.analyzers.collective_match` says how instances are matched).
Rendered by :mod:`~torchprof_args.analysis.render.collectives`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchprof_args.analysis.analyzers.collective_match import CycleCollectives, match_collectives
from torchprof_args.analysis.analyzers.collectives import RankComms, rank_collectives
from torchprof_args.analysis.collect.discover import choose_cycle, expand
from torchprof_args.analysis.decode.loader import load_trace, release_memory_eagerly
from torchprof_args.errors import TraceError
from torchprof_args.naming import rank_from_file_name

__all__ = ["collectives_report"]


def collectives_report(paths: Sequence[str | Path], *, cycle: int | None = None, top: int = 20,
                       progress: bool = False, workers: int | None = None) -> CycleCollectives:
    """Load one cycle's traces and match their collectives across ranks.

    Args:
        paths: trace files, cycle folders or run folders.
        cycle: the cycle whose traces start at this iteration (default: the latest).
        top: worst-skew instances listed.
        progress: progress bars while decoding; ``workers``: decoding processes per trace.

    Returns:
        The cycle's :class:`~torchprof_args.analysis.analyzers.collective_match.CycleCollectives`:
        ``match_collectives``' report and which cycle was read.  Raises
        :class:`~torchprof_args.errors.TraceError` on a trace that cannot be read, or two traces of
        one rank.
    """
    release_memory_eagerly()
    files, cycle_text = choose_cycle(expand(list(paths)), cycle)
    ranks: dict[int, RankComms] = {}
    for index, path in enumerate(files):
        trace = load_trace(path, progress=progress, workers=workers, comms=True)
        rank = trace.rank if trace.rank is not None else rank_from_file_name(path.name)
        rank = index if rank is None else rank
        if rank in ranks:
            raise TraceError(f"{path}: a second trace of rank {rank} (also {ranks[rank].file}); give one "
                             "cycle's traces (--cycle picks one in a directory)")
        ranks[rank] = rank_collectives(trace, rank)
        del trace
    return {**match_collectives(list(ranks.values()), top=top), "cycle": cycle_text}
