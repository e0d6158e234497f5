"""The cross-rank view of one cycle: distributions over ranks, the slowest and fastest ranks.

Built from per-rank summaries (sidecars or parsed traces), so it costs nothing per event: 1,024
ranks take milliseconds.  For each rank: its mean step time, each step's time (the heatmap),
GPU idle / compute and communication/computation overlap (HTA definitions), where it runs (host,
parallel coordinates).  Over ranks: min / p50 / p90 / max of step time, idle and overlap; the k
slowest and fastest ranks and the stragglers by the one rule (:mod:`torchprof_args.shared.stragglers`),
all by each rank's *work* per step (its mean step less its time in collectives:
:mod:`~torchprof_args.analysis.analyzers.step_work`).  In a synchronous job every rank's step is as
long: the rank the others wait for has the most work, and the ranks that wait have the longest
collectives (their step can even be the longest), so step times would name a waiting rank.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.fsdp import FsdpStepSplit
from torchprof_args.analysis.summary.document import Summary
from torchprof_args.shared import stragglers as rule

__all__ = [
    "DISTRIBUTION_KEYS", "WORK_LABEL", "CrossRankView", "Distribution", "Distributions", "RankRow",
    "cross_rank", "distribution",
]

#: what the view ranks and scores, in words (the straggler rule's figure here).
WORK_LABEL = "work (the mean step less the time in collectives)"
#: the per-rank figures whose distribution over ranks the view reports (:class:`Distributions`).
DISTRIBUTION_KEYS = ("step_mean_us", "idle_pct", "comm_comp_overlap_pct")


class Distribution(msgspec.Struct, frozen=True, gc=False):
    """min / p50 / p90 / max / mean of a figure over the ranks that have it (``n``; all None when 0)."""

    n: int
    min: float | None
    p50: float | None
    p90: float | None
    max: float | None
    mean: float | None


class Distributions(msgspec.Struct, frozen=True):
    """The distribution over ranks of each of :data:`DISTRIBUTION_KEYS`."""

    step_mean_us: Distribution
    idle_pct: Distribution
    comm_comp_overlap_pct: Distribution


class RankRow(msgspec.Struct, frozen=True):
    """One rank in the view.

    Attributes:
        rank: its rank (its position among the summaries when its trace does not say).
        file: its trace; ``host`` and ``parallel``: where it ran.
        steps: how many steps; ``step_us`` each one's time by name; ``step_mean_us`` their mean;
            ``work_mean_us`` the mean step less its time in collectives.
        idle_pct, compute_pct, comm_comp_overlap_pct: its GPU breakdown's (None without kernels).
        straggler_score: its work over the other ranks' median (None without steps).
        fsdp_step: its mean step by FSDP2 phase (None: not ``fully_shard``-ed).
    """

    rank: int
    file: str
    host: str | None
    parallel: dict[str, int] | None
    steps: int
    step_us: dict[str, float]
    step_mean_us: float | None
    work_mean_us: float | None
    idle_pct: float | None
    compute_pct: float | None
    comm_comp_overlap_pct: float | None
    straggler_score: float | None
    fsdp_step: FsdpStepSplit | None = None


class CrossRankView(msgspec.Struct, frozen=True):
    """One cycle over its ranks: what ``torchprof summary --json`` prints as ``cross_rank``.

    Attributes:
        ranks: every rank's row, by rank.
        distributions: mean step, GPU idle and overlap over the ranks.
        steps: every step name of the cycle, in ``ProfilerStep#N`` order.
        slowest, fastest: the ``k`` ranks with the most / least work per step.
        stragglers: the ranks whose work is at least ``straggler_threshold`` times the other
            ranks' median and ``straggler_min_ms`` over it, the highest score first.
        slowest_rank, fastest_rank: None when no rank has steps; ``spread_pct`` their difference in
            work, in % of ``step_mean_us`` (the mean step over ranks): the share of the step the
            imbalance costs.
    """

    ranks: list[RankRow]
    distributions: Distributions
    steps: list[str]
    slowest: list[RankRow]
    fastest: list[RankRow]
    stragglers: list[RankRow]
    straggler_threshold: float
    straggler_min_ms: float
    slowest_rank: int | None
    fastest_rank: int | None
    spread_pct: float | None
    step_mean_us: float | None


def distribution(values: list[float | None]) -> Distribution:
    """The distribution of the values that are not None."""
    data = np.array([v for v in values if v is not None], dtype=np.float64)
    if len(data) == 0:
        return Distribution(n=0, min=None, p50=None, p90=None, max=None, mean=None)
    p50, p90 = np.percentile(data, [50, 90])
    return Distribution(n=int(len(data)), min=float(data.min()), p50=float(p50), p90=float(p90),
                        max=float(data.max()), mean=float(data.mean()))


def cross_rank(summaries: list[Summary], k: int = 5) -> CrossRankView:
    """The view of one cycle's per-rank summaries.

    Args:
        summaries: the cycle's summaries (a summary without a rank takes its position).
        k: how many slowest and fastest ranks to name.

    Returns:
        The view; ranks without steps are listed but not compared.
    """
    rows = sorted((_rank_row(i, s) for i, s in enumerate(summaries)), key=lambda r: (r.rank, r.file))
    dists = Distributions(step_mean_us=distribution([r.step_mean_us for r in rows]),
                          idle_pct=distribution([r.idle_pct for r in rows]),
                          comm_comp_overlap_pct=distribution([r.comm_comp_overlap_pct for r in rows]))
    rows, slow_ranks = _scored(rows)
    timed = [r for r in rows if r.work_mean_us is not None]
    by_time = sorted(timed, key=lambda r: (-(r.work_mean_us or 0.0), r.rank))
    mean = dists.step_mean_us.mean
    slow, fast = (by_time[0], by_time[-1]) if by_time else (None, None)
    spread = None
    if slow is not None and fast is not None:
        spread = 100.0 * ((slow.work_mean_us or 0.0) - (fast.work_mean_us or 0.0)) / mean if mean else 0.0
    return CrossRankView(
        ranks=rows,
        distributions=dists,
        steps=_step_names(rows),
        slowest=by_time[:k],
        fastest=by_time[::-1][:k],
        stragglers=slow_ranks,
        straggler_threshold=rule.STRAGGLER_THRESHOLD,
        straggler_min_ms=rule.STRAGGLER_MIN_MS,
        slowest_rank=slow.rank if slow is not None else None,
        fastest_rank=fast.rank if fast is not None else None,
        spread_pct=spread,
        step_mean_us=mean if by_time else None,
    )


def _scored(rows: list[RankRow]) -> tuple[list[RankRow], list[RankRow]]:
    """``rows`` with their straggler scores; the stragglers, the highest score first."""
    timed = [i for i, r in enumerate(rows) if r.work_mean_us is not None]
    work = {i: rows[i].work_mean_us or 0.0 for i in timed}
    others = dict(zip(timed, rule.others_medians(list(work.values())), strict=True)) if len(timed) > 1 else {}
    for i, other in others.items():
        rows[i] = msgspec.structs.replace(rows[i], straggler_score=rule.straggler_score(work[i], other))
    slow = [rows[i] for i in others if rule.is_straggler(work[i] / 1e3, others[i] / 1e3)]
    return rows, sorted(slow, key=lambda r: -(r.straggler_score or 0.0))


def _rank_row(index: int, summary: Summary) -> RankRow:
    gpu = summary.gpu
    return RankRow(
        rank=summary.rank if summary.rank is not None else index,
        file=summary.file,
        host=summary.host,
        parallel=summary.parallel,
        steps=len(summary.steps),
        step_us={s.name: s.dur_us for s in summary.steps},
        step_mean_us=summary.step_mean_us,
        work_mean_us=summary.work_mean_us,
        idle_pct=gpu.idle_pct if gpu is not None else None,
        compute_pct=gpu.compute_pct if gpu is not None else None,
        comm_comp_overlap_pct=gpu.comm_comp_overlap_pct if gpu is not None else None,
        straggler_score=None,
        fsdp_step=summary.fsdp_step,
    )


def _step_names(rows: list[RankRow]) -> list[str]:
    """Every step name of the cycle, in ``ProfilerStep#N`` order."""
    names = {name for r in rows for name in r.step_us}

    def number(name: str) -> tuple[int, str]:
        tail = name.rsplit("#", 1)[-1]
        return (int(tail), name) if tail.isdigit() else (1 << 62, name)

    return sorted(names, key=number)
