"""``memory_imbalance``: ranks that hold more memory at their peak than the others.

From each rank's memory part (its summary sidecar's ``memory``: PyTorch's categories when the trace
was published with shapes, memory and stacks, else the trace's own), given to the cycle's view
(:class:`~..cycle.CycleRanks`'s ``memory``): a rank whose peak is over the median of the ranks by
:data:`~torchprof_args.analysis.memory.ranks.OUTLIER_SHARE` and
:data:`~torchprof_args.analysis.memory.ranks.OUTLIER_MIN_BYTES` is named, with its pipeline stage
and parallel coordinates and the category that makes the difference (``torchprof mem`` lists every
rank).  Memory costs no step time, so the finding saves no time (its saving is 0 ms: it sorts after
every time finding); its evidence says how many bytes balancing would free on the rank that runs out
first.  Its threshold in time is none (``THRESHOLD``); the bytes' is the outlier rule.
"""

from __future__ import annotations

from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.cycle import CycleRanks
from torchprof_args.analysis.diagnose.finding import NO_THRESHOLD, Finding, Gap
from torchprof_args.analysis.memory.categories import human_bytes
from torchprof_args.analysis.memory.ranks import outliers, rank_rows
from torchprof_args.analysis.memory.report import IMBALANCE_REMEDY, STAGE_REMEDY

__all__ = ["KIND", "SCOPE", "THRESHOLD", "analyze"]

KIND = "memory_imbalance"
SCOPE = Scope.CROSS_RANK
#: no threshold in time (memory costs none); a rank must stand 5 % and 1 MiB over the median peak.
THRESHOLD = NO_THRESHOLD


def analyze(ranks: CycleRanks, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The ranks whose peak memory stands over the median; None with fewer than two measured ranks."""
    found = outliers(rank_rows([("", part) for part in ranks.memory]))
    if not found:
        return None
    worst = found[0]
    summary = worst.summary if len(found) == 1 else (
        f"{len(found)} ranks hold more memory than the median; worst: {worst.summary}")
    return Finding(
        kind=KIND, summary=summary + ".", ranks=tuple(o.rank for o in found), ms_per_step=0.0,
        share_of_step=0.0, saving_ms_per_step=0.0,
        saving_bound=f"memory, not time: balancing frees {human_bytes(worst.over_median_bytes)} on rank "
                     f"{worst.rank}, the first to run out",
        remedy=IMBALANCE_REMEDY if worst.stage is None else STAGE_REMEDY.format(stage=worst.stage),
        evidence={"per_rank": [{"rank": o.rank, "peak_bytes": o.peak_bytes,
                                "over_median_bytes": o.over_median_bytes, "category": o.category,
                                "stage": o.stage, "coordinates": o.coordinates} for o in found[:16]],
                  "median_bytes": worst.median_bytes})
