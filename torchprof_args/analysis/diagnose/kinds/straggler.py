"""``straggler``: a rank that does more work per step than the others, so that they wait for it.

In a synchronous job every rank's step lasts about as long as the slowest rank's: the fast ranks
wait for the slow one inside the step's collectives.  So step times alone cannot name the slow
rank.  What can is each rank's *work* per step: the step's time minus the time the rank spent in
collectives (where it waits for the others).  :mod:`~torchprof_args.analysis.analyzers.step_work`
measures it on one rank (it goes into the summary sidecar, a few numbers per step); :func:`analyze`
names the stragglers by the one rule (:mod:`torchprof_args.shared.stragglers`: work at least
1.05x the median of the *other* ranks' and 2 ms over it, the 2 ms being :data:`THRESHOLD`), each by
its excess per step.

A straggler whose experts receive more than their share of the routed tokens (an earlier
``expert_imbalance`` finding names it: the registry runs that kind first) is left to that finding:
its excess is the routed tokens' expert work, whose fix moves the work to the other ranks rather than
removing it; the ranks left out are listed in ``deferred_to_expert_imbalance``.

Bound of the saving: the others wait for the slowest rank at most its excess, so the job saves at
most the worst straggler's excess per step (less if the collectives' transfer time grows).
"""

from __future__ import annotations

from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.cycle import CycleRanks
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
from torchprof_args.analysis.diagnose.kind_names import EXPERT_IMBALANCE, STRAGGLER
from torchprof_args.shared import stragglers as rule

__all__ = ["KIND", "SCOPE", "THRESHOLD", "analyze"]

KIND = STRAGGLER
SCOPE = Scope.CROSS_RANK
#: no share of the step: the straggler rule's (a rank's work 1.05x the others' median) and its 2 ms.
THRESHOLD = Threshold(share_of_step=0.0, min_ms=rule.STRAGGLER_MIN_MS)


def analyze(ranks: CycleRanks, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The straggler finding over one cycle's ranks.

    A rank's work is its mean step minus the time it waited in collectives for the last rank
    (``ranks.waited_us``, from the matched collectives); without matched collectives, each rank's
    own collective time (its steps' ``work_us``).

    Args:
        ranks: the cycle's rank parts (their steps) and the job's step.
        kind_ctx: the kind's context (thresholds off: every rank with work over the others' median).

    Returns:
        The finding; None with fewer than two timed ranks or no straggler.
    """
    work = ranks.work_ms
    if len(work) < 2:
        return None
    others = dict(zip(work, rule.others_medians(list(work.values())), strict=True))
    excess = {rank: mine - others[rank] for rank, mine in work.items()}
    ratio = 0.0 if kind_ctx.thresholds_off else rule.STRAGGLER_THRESHOLD
    min_ms = kind_ctx.threshold(THRESHOLD).min_ms
    slow = sorted((r for r in work if rule.is_straggler(work[r], others[r], ratio, min_ms)),
                  key=lambda r: -excess[r])
    overloaded = kind_ctx.earlier_of(EXPERT_IMBALANCE)
    deferred = [r for r in slow if overloaded is not None and r in overloaded.ranks]
    slow = [r for r in slow if r not in deferred]
    if not slow:
        return None
    step = ranks.step_ms or max(work.values())
    worst = slow[0]
    part = next(p for p in ranks.parts if ranks.rank_of(p) == worst)
    worst_step = max(part.steps, key=lambda s: s.dur_us)
    ms, others_ms = excess[worst], others[worst]
    return Finding(
        kind=KIND,
        summary=(f"Rank {worst} works {ms:.1f} ms more per step than the median of the other ranks "
                 f"({work[worst]:.1f} vs {others_ms:.1f} ms outside collectives), and the others "
                 "wait for it in the step's collectives."),
        ranks=tuple(slow), ms_per_step=ms, share_of_step=ms / step if step else 0.0, saving_ms_per_step=ms,
        saving_bound="the worst rank's extra work per step: the others wait for it at most that long",
        remedy=(f"Look at what rank {worst} does differently (its `torchprof summary`: data, load "
                "balance, a slower host or GPU, thermal throttling); rebalance or replace the node."),
        evidence={
            "excess_ms_per_step": {str(r): round(excess[r], 3) for r in slow[:16]},
            "straggler_score": {str(r): round(score, 3) for r in slow[:16]
                                if (score := rule.straggler_score(work[r], others[r])) is not None},
            "work_ms_per_step": {str(r): round(work[r], 3) for r in sorted(work)[:16]},
            "median_work_ms_of_others": round(others_ms, 3),
            "worst_step": worst_step.name,
            **({"deferred_to_expert_imbalance": deferred} if deferred else {}),
            "perfetto_rank": worst, "perfetto_ts_us": worst_step.start_us,
        },
    )
