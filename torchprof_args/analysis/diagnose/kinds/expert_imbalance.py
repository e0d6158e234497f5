"""``expert_imbalance``: a Mixture-of-Experts router that sends more tokens to some ranks' experts
than to others', so that the other ranks wait for their expert work.

From the variable-size all-to-alls the collectives matcher pairs (an expert-parallel MoE layer's
dispatch, its combine and their gradients: ``bytes_by_rank``, each rank's ``[sent, received]``
bytes): in each such all-to-all the experts' side is the direction whose sizes differ between ranks
(a dispatch's received bytes, a combine's sent bytes: every rank sends its own batch, the experts
get what the router gave them: :func:`~.collective_match.experts_side`).  A rank's **routed
tokens** are the rows on its experts' side (bytes over the bytes of one row, a token's hidden
state, which the recorded shapes give), the mean over the cycle's variable all-to-alls: the tokens
its experts receive per dispatch; where a row's size is not known, the experts' side bytes per step
stand in (``tokens_measure`` says which).
The traces do not say which expert of a rank got the tokens: the figures are per rank.  Where the
framework logged its tokens per expert (:mod:`..expert_tokens`: Megatron-LM's
``--save-tokens-per-expert-interval``, or torchtitan's MoE layers' counts the profiler recorded with
the traces), the finding names the busiest expert and gives each expert's
tokens, the source named (``tokens_per_expert``, ``expert_imbalance_factor``, ``expert_tokens_source``).

``imbalance_factor`` is the heaviest rank's routed tokens over the ranks' mean.  A finding needs it
at :data:`IMBALANCE_MIN` or more and the overloaded ranks' work per step
(:attr:`~..cycle.CycleRanks.work_ms`, the figure ``straggler`` compares) over the mean rank's by
:data:`THRESHOLD`; it names the ranks whose routed tokens are :data:`IMBALANCE_MIN` x the mean or
more and whose work is over the mean, heaviest first.

Its fix moves work, it does not remove it: with the router balanced, the heavy ranks' experts get
fewer tokens and the light ranks' more.  So the bound is the worst rank's work over the mean rank's
(not over the others', as a straggler's), and the saving on the critical path replays every rank with
its expert work (the stretches from a dispatch to its combine) scaled to the ranks' mean
(:func:`~torchprof_args.analysis.critical_path.cycle.mean_into`).
The kind runs before ``straggler`` (the registry's order): a straggler it names is left to it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from torchprof_args.analysis.analyzers.collective_match import CollectiveInstance, experts_side
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.cycle import CycleRanks
from torchprof_args.analysis.diagnose.expert_tokens import ExpertTokens
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
from torchprof_args.analysis.diagnose.kind_names import EXPERT_IMBALANCE
from torchprof_args.shared import stragglers as rule

__all__ = ["IMBALANCE_MIN", "KIND", "SCOPE", "THRESHOLD", "RoutedTokens", "analyze", "routed_tokens"]

KIND = EXPERT_IMBALANCE
SCOPE = Scope.CROSS_RANK
#: the overloaded rank's work over the mean rank's must reach 2 % of the step and 1 ms.
THRESHOLD = Threshold(share_of_step=0.02, min_ms=1.0)
#: the heaviest rank's routed tokens over the ranks' mean, at least (a rank is overloaded from it).
IMBALANCE_MIN = 1.1
_TOKENS = "tokens per dispatch: the rows each rank's experts receive (bytes / a row's bytes, from the shapes)"
_BYTES = "bytes per step on each rank's experts' side (a row's size is not known: bytes stand in for tokens)"


@dataclass(frozen=True)
class RoutedTokens:
    """What each rank's experts received in one cycle's variable-size all-to-alls.

    Attributes:
        per_rank: rank -> routed tokens per dispatch (``unit`` ``"tokens"``) or the experts' side
            bytes per step (``"bytes"``).
        unit: ``"tokens"`` or ``"bytes"``.
        all_to_alls: the variable-size all-to-alls counted.
        heaviest: per rank, the all-to-all where its experts' side was largest.
    """

    per_rank: dict[int, float]
    unit: str
    all_to_alls: int
    heaviest: dict[int, CollectiveInstance]

    @property
    def imbalance_factor(self) -> float:
        """The heaviest rank's routed tokens over the ranks' mean (0 when none moved)."""
        mean = statistics.fmean(self.per_rank.values())
        return max(self.per_rank.values()) / mean if mean > 0 else 0.0


def routed_tokens(ranks: CycleRanks) -> RoutedTokens | None:
    """Each rank's routed tokens from the cycle's variable-size all-to-alls (see the module).

    Args:
        ranks: the cycle's rank parts, their collectives matched.

    Returns:
        The :class:`RoutedTokens`; None without a variable-size all-to-all.
    """
    found = [i for i in ranks.matched if i["kind"] == "all_to_all" and i["bytes_by_rank"]]
    if not found:
        return None
    sides: list[tuple[CollectiveInstance, dict[int, int], dict[int, int | None]]] = []
    for inst in found:
        pairs = {int(r): pair for r, pair in (inst["bytes_by_rank"] or {}).items()}
        which = experts_side(pairs) or 0
        records = ranks.members.get(inst["id"], {})
        rows = {r: records[r].row_bytes if r in records else None for r in pairs}
        if len({size for size in rows.values() if size}) > 1:
            continue  # rows of different sizes: not one all-to-all (an order-matched pair gone wrong)
        sides.append((inst, {r: p[which] for r, p in pairs.items()}, rows))
    if not sides:
        return None
    in_tokens = all(size for _, _, rows in sides for size in rows.values())
    total: dict[int, float] = defaultdict(float)
    heaviest: dict[int, tuple[float, CollectiveInstance]] = {}
    for inst, side, rows in sides:
        for rank, nbytes in side.items():
            value = nbytes / (rows[rank] or 1) if in_tokens else float(nbytes)
            total[rank] += value
            if rank not in heaviest or nbytes > heaviest[rank][0]:
                heaviest[rank] = (nbytes, inst)
    per = len(sides) if in_tokens else max(ranks.n_steps, 1)
    return RoutedTokens({r: v / per for r, v in sorted(total.items())}, "tokens" if in_tokens else "bytes",
                        len(sides), {r: inst for r, (_, inst) in heaviest.items()})


def analyze(ranks: CycleRanks, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The expert-imbalance finding over one cycle's ranks.

    Args:
        ranks: the cycle's rank parts (their collectives, matched once; their work per step).
        kind_ctx: the kind's context (thresholds off: every rank over the mean, whatever the size).

    Returns:
        The finding; None without variable-size all-to-alls, below :data:`IMBALANCE_MIN` or
        :data:`THRESHOLD`.
    """
    routed = routed_tokens(ranks)
    work = ranks.work_ms
    if routed is None or len(routed.per_rank) < 2 or len(work) < 2:
        return None
    tokens = routed.per_rank
    mean_tokens = statistics.fmean(tokens.values())
    mean_work = statistics.fmean(work.values())
    least = 1.0 if kind_ctx.thresholds_off else IMBALANCE_MIN
    named = sorted((r for r in tokens if r in work and tokens[r] >= least * mean_tokens > 0
                    and work[r] > mean_work), key=lambda r: -tokens[r])
    if not named:
        return None
    over = {r: work[r] - mean_work for r in named}
    worst = max(named, key=over.__getitem__)
    ms, step = over[worst], ranks.step_ms or max(work.values())
    if not kind_ctx.threshold(THRESHOLD).reached(ms, ms / step if step else None):
        return None
    others = dict(zip(work, rule.others_medians(list(work.values())), strict=True))
    factor = tokens[worst] / mean_tokens
    unit = "tokens per dispatch" if routed.unit == "tokens" else "bytes per step"
    inst = routed.heaviest[worst]
    end_us = inst["first_start_us"] + inst["arrival_offset_us"][worst] + inst["dur_us"][worst]
    logged, per_expert = kind_ctx.expert_tokens, ""
    if logged is not None and logged.per_rank:
        hot_rank, hot_expert = logged.hottest
        per_expert = (f" Per expert (as the framework logged them): rank {hot_rank}'s local expert "
                      f"{hot_expert} gets {logged.imbalance_factor:.2f}x the experts' mean.")
    return Finding(
        kind=KIND,
        summary=(f"Rank {worst}'s experts receive {factor:.2f}x the ranks' mean of the routed tokens "
                 f"({tokens[worst]:,.0f} vs {mean_tokens:,.0f} {unit}), so it works {ms:.1f} ms more per "
                 "step than the mean rank and the others wait for it in the all-to-alls." + per_expert),
        ranks=tuple(named), ms_per_step=ms, share_of_step=ms / step if step else 0.0, saving_ms_per_step=ms,
        saving_bound=(f"rank {worst}'s work per step over the mean rank's: balanced, the expert work moves "
                      "to the lighter ranks (it is not removed), so the step shortens at most by that"),
        remedy=("Balance the router: a load-balancing auxiliary loss (Megatron --moe-aux-loss-coeff) or "
                "aux-loss-free bias updates (Megatron --moe-router-enable-expert-bias; torchtitan: a larger "
                "load_balance_coeff in the MoE config), a capacity factor that "
                "drops or re-routes the overflow (--moe-expert-capacity-factor), or place (replicate) the "
                f"hot experts apart from rank {worst}'s."),
        evidence={
            "imbalance_factor": round(routed.imbalance_factor, 3),
            "tokens_per_rank": {str(r): round(v, 1) for r, v in sorted(tokens.items(),
                                                                       key=lambda kv: -kv[1])[:16]},
            "tokens_measure": _TOKENS if routed.unit == "tokens" else _BYTES,
            "all_to_alls": routed.all_to_alls,
            "work_ms_per_step": {str(r): round(work[r], 3) for r in sorted(work)[:16]},
            "mean_work_ms": round(mean_work, 3),
            "over_mean_ms_per_step": {str(r): round(over[r], 3) for r in named[:16]},
            "excess_ms_per_step": {str(r): round(max(work[r] - others[r], 0.0), 3) for r in named[:16]},
            "perfetto_rank": worst, "perfetto_ts_us": end_us - ranks.base_us.get(worst, 0.0),
            **_per_expert(logged),
        },
    )


def _per_expert(logged: ExpertTokens | None) -> dict[str, object]:
    """The evidence of the framework's tokens per expert (nothing where it logged none)."""
    if logged is None or not logged.per_rank:
        return {}
    ranked = sorted(logged.per_expert().items(), key=lambda kv: -kv[1])[:16]
    return {"tokens_per_expert": {f"rank {r} expert {e}": round(v, 1) for (r, e), v in ranked},
            "expert_imbalance_factor": round(logged.imbalance_factor, 3),
            "expert_tokens_source": f"{logged.source}: {logged.path}, tokens per iteration over "
                                    f"{'the traced' if logged.traced else 'every logged'} iterations "
                                    f"{logged.iterations[0]}-{logged.iterations[-1]}"}
