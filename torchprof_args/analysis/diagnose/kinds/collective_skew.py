"""``collective_skew``: ranks that arrive late at collectives, which the other ranks wait for.

From the collectives matcher (:mod:`torchprof_args.analysis.analyzers.collective_match`): for each
collective seen by two or more ranks, the arrival skew is the last rank's start minus the first's; every
other rank waits in the collective for that long at most.  Per step, the job loses the union of the
instances' [first arrival, last arrival] intervals (collectives that overlap, like DDP's gradient buckets,
count once).  Point-to-point transfers (send / recv) are left out: their waits are a pipeline's bubble
(``pipeline_bubble``), not a late rank.  The ranks named are those that arrived last in the
instances that caused at least :data:`LATE_SHARE_MIN_PCT` of the waiting.

It works from each rank's collective records, which the summary sidecar keeps in a compact form
(:class:`~..documents.CompactRecords`), so 512 ranks are matched without reading a trace (the
matching is :class:`~..cycle.CycleRanks`'s, shared with ``straggler``).  Below :data:`THRESHOLD`
it reports nothing: the skew of healthy ranks is launch jitter.  It runs after ``straggler`` (the
registry's order) and leaves out the waiting the stragglers' extra work explains (and that of the
ranks ``expert_imbalance`` names, run before it): a straggler's lateness *is* that work.  Ranks
on different hosts are compared on their own clocks: a skew below the hosts' clock offset is noise
(the bound says so).
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.cycle import CycleRanks, union_us
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
from torchprof_args.analysis.diagnose.kind_names import EXPERT_IMBALANCE, STRAGGLER

__all__ = ["KIND", "LATE_SHARE_MIN_PCT", "SCOPE", "THRESHOLD", "analyze"]

KIND = "collective_skew"
SCOPE = Scope.CROSS_RANK
#: the union of the step's arrival skews (the others' waiting) must reach 2 % of the step and 0.5 ms.
THRESHOLD = Threshold(share_of_step=0.02, min_ms=0.5)
#: a rank is named when the instances it arrived last at caused this share (%) of the waiting.
LATE_SHARE_MIN_PCT = 10.0


def _share(ms: float, step_ms: float | None) -> float | None:
    return ms / step_ms if step_ms else None


def analyze(ranks: CycleRanks, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The collective-skew finding over one cycle's ranks.

    The time lost per step is the union of the matched instances' [first arrival, last arrival]
    intervals; a ``straggler`` among the earlier findings takes out the waiting it caused, up to its
    excess.

    Args:
        ranks: the cycle's rank parts (their collectives, matched once) and the job's step.
        kind_ctx: the earlier findings (``straggler``'s), the thresholds.

    Returns:
        The finding; None without matched collectives or below :data:`THRESHOLD`.
    """
    skew = _skew(ranks, kind_ctx.threshold(THRESHOLD))
    slow = [f for kind in (EXPERT_IMBALANCE, STRAGGLER) if (f := kind_ctx.earlier_of(kind))]
    if skew is None or not slow:
        return skew
    return _beyond_stragglers(skew, slow, ranks.step_ms, kind_ctx.threshold(THRESHOLD))


def _skew(ranks: CycleRanks, threshold: Threshold) -> Finding | None:
    """The skew of the matched collectives, before the stragglers are taken out."""
    matched, step_ms = ranks.matched, ranks.step_ms
    if not matched or ranks.match is None:
        return None
    steps = max(ranks.n_steps, 1)
    ms = union_us([(i["first_start_us"], i["first_start_us"] + i["skew_us"]) for i in matched]) / steps / 1e3
    if step_ms:
        ms = min(ms, step_ms)
    if not threshold.reached(ms, _share(ms, step_ms)):
        return None
    caused: dict[int, float] = defaultdict(float)
    for inst in matched:
        caused[inst["last_rank"]] += inst["skew_us"]
    grand = sum(caused.values()) or 1.0
    late = sorted((r for r, us in caused.items() if 100.0 * us / grand >= LATE_SHARE_MIN_PCT),
                  key=lambda r: -caused[r])
    worst = max(matched, key=lambda i: i["skew_us"])
    base = ranks.base_us.get(worst["last_rank"], 0.0)
    kinds: dict[str, float] = defaultdict(float)
    for inst in matched:
        kinds[inst["kind"]] += inst["skew_us"] / steps / 1e3
    names = ", ".join(str(r) for r in late[:8]) + (" ..." if len(late) > 8 else "")
    return Finding(
        kind=KIND,
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
            "matched_by": ranks.match["matched_by"],
            "worst": {"kind": worst["kind"], "pg": worst["pg"], "step": worst["step"],
                      "skew_ms": round(worst["skew_us"] / 1e3, 3), "last_rank": worst["last_rank"]},
            "perfetto_rank": worst["last_rank"],
            "perfetto_ts_us": worst["first_start_us"] + worst["skew_us"] - base,
        },
    )


def _beyond_stragglers(skew: Finding, slow: list[Finding], step_ms: float | None,
                       threshold: Threshold) -> Finding | None:
    """The skew left once the stragglers' extra work (``straggler``'s, and the overloaded ranks' of
    ``expert_imbalance``) is taken out (their lateness *is* that work): the waiting each slow rank
    caused, up to its excess, is subtracted; None when nothing is left above the threshold."""
    caused: dict[str, float] = skew.evidence.get("wait_caused_ms_per_step") or {}
    excess: dict[str, float] = {}
    for finding in slow:
        excess.update(finding.evidence.get("excess_ms_per_step") or {})
    explained = sum(min(caused.get(r, 0.0), x) for r, x in excess.items())
    left = skew.ms_per_step - explained
    if not threshold.reached(left, _share(left, step_ms)):
        return None
    return msgspec.structs.replace(
        skew, ms_per_step=left, saving_ms_per_step=left,
        share_of_step=left / step_ms if step_ms else skew.share_of_step,
        summary=f"{skew.summary[:-1]}; {left:.1f} ms of it beyond the stragglers' extra work.",
        evidence={**skew.evidence, "explained_by_straggler_ms": round(explained, 3)})
