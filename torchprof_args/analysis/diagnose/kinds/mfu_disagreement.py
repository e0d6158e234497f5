"""``mfu_disagreement``: the step timers' MFU and the traces' count different FLOPs.

Two MFUs describe one job: the step timers' (dashboards, wandb: the model FLOPs a formula gives,
``--metrics-flops-per-iteration`` or the framework's, per GPU) and ``low_mfu``'s (the FLOPs of the
matrix products and attention operators the traces recorded, from their shapes).  Frameworks'
formulas disagree by up to 5x on MoE models (torchtitan #4300), so where both exist they are
compared: the formula's FLOPs per GPU and iteration (:mod:`..step_timers`) against the traced ranks'
mean counted FLOPs per step.  Past :data:`RATIO` either way, a finding says which FLOPs each counted
and what usually explains the direction; it saves no time (its ``ms_per_step`` is 0): it says which
of the job's MFU figures to believe before acting on ``low_mfu`` or a dashboard.

Not compared: pipeline-parallel cycles where only some ranks were traced and their counts differ
by more than :data:`RATIO` (the traced stages are not the job's mean).
"""

from __future__ import annotations

import statistics

from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.cycle import CycleRanks
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold

__all__ = ["KIND", "RATIO", "SCOPE", "THRESHOLD", "analyze"]

KIND = "mfu_disagreement"
SCOPE = Scope.CROSS_RANK
#: a measurement, not a cost: no time threshold (:data:`RATIO` decides).
THRESHOLD = Threshold()
#: the larger FLOPs figure over the smaller one, at least, for a finding (20 %).
RATIO = 1.2

_TRACE_COUNTS = ("the traces count the matrix products and attention operators each rank ran, from their "
                 "shapes (recomputed forwards included; elementwise operators, and kernels no operator "
                 "with a FLOP count launched, left out)")
_FORMULA_MORE = ("the formula counts FLOPs the traces do not see: compiled (Triton) or fused kernels "
                 "launched outside the counted operators, or, on an MoE model, every expert's FLOPs "
                 "instead of the active ones; or it is not per GPU (check the world size it is divided by)")
_TRACE_MORE = ("the traces count FLOPs the formula leaves out: activation recomputation (hardware FLOPs, "
               "not model FLOPs), attention or the output layer missing from the formula, or a "
               "--metrics-flops-per-iteration for fewer tokens than each iteration takes")


def analyze(ranks: CycleRanks, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The step timers' FLOPs against the traces' counted FLOPs.

    Args:
        ranks: the cycle's rank parts (their MFU inputs: FLOPs counted per step).
        kind_ctx: the step timers' FLOPs (``formula``; None: no ``metrics.jsonl`` with them).

    Returns:
        The finding past :data:`RATIO`; None when they agree or either figure is missing.
    """
    formula = kind_ctx.formula
    counted = {ranks.rank_of(p): p.mfu_inputs.flops_per_step for p in ranks.parts
               if p.mfu_inputs is not None and p.mfu_inputs.flops_per_step > 0}
    if formula is None or not counted or formula.flops_per_gpu <= 0:
        return None
    world = next((p.world_size for p in ranks.parts if p.world_size), None)
    spread = max(counted.values()) / min(counted.values())
    if world and len(counted) < world and spread > RATIO:
        return None  # some stages traced: their mean is not the job's
    traced = statistics.fmean(counted.values())
    ratio = formula.flops_per_gpu / traced
    if not kind_ctx.thresholds_off and 1 / RATIO < ratio < RATIO:
        return None
    more = "formula" if ratio > 1 else "traces"
    why = _FORMULA_MORE if ratio > 1 else _TRACE_MORE
    inputs = [p.mfu_inputs for p in ranks.parts if p.mfu_inputs is not None]
    known = [i.accounted_ms / i.compute_ms for i in inputs if i.compute_ms and i.accounted_ms is not None]
    evidence: dict[str, object] = {
        "formula_flops_per_gpu_per_step": _digits(formula.flops_per_gpu),
        "counted_flops_per_step": _digits(traced),
        "formula_over_counted": round(ratio, 4),
        "counted_flops_per_rank": {str(r): _digits(v) for r, v in sorted(counted.items())[:16]},
        "formula_source": formula.path,
        "formula_intervals": formula.intervals,
        "formula_intervals_of": "the traced iterations" if formula.traced else "the whole run",
        "formula_counts": ("model FLOPs per iteration (--metrics-flops-per-iteration or the framework's "
                           "formula) over the GPUs"),
        "traces_count": _TRACE_COUNTS,
    }
    if formula.mfu_percent is not None:
        evidence["step_timers_mfu_percent"] = round(formula.mfu_percent, 2)
    if known:
        evidence["flops_known_share_of_gpu_compute"] = round(min(known), 4)
    larger = max(ratio, 1 / ratio)
    return Finding(
        kind=KIND, ranks=tuple(sorted(counted)),
        summary=(f"The step timers' MFU rests on {_text(formula.flops_per_gpu)} per GPU and iteration, "
                 f"the traces count {_text(traced)} per rank and step: the {more} count {larger:.2f}x as "
                 "many, so the dashboards' MFU and low_mfu's disagree by as much."),
        ms_per_step=0.0, share_of_step=0.0, saving_ms_per_step=0.0,
        saving_bound="no time: a measurement to settle before acting on either MFU",
        remedy=(f"Settle which count is right ({why}), then correct the formula (or "
                "--metrics-flops-per-iteration), or record what the traces miss "
                "(--torch-profile-record-shapes on every rank), so that one MFU is reported."),
        evidence=evidence,
    )


def _digits(flops: float) -> float:
    """``flops`` to 4 significant digits (a tiny CPU job's and a 1000-GPU job's alike)."""
    return float(f"{flops:.4g}")


def _text(flops: float) -> str:
    """``flops`` with its unit: ``7.55e+07`` -> ``75.5 MFLOPs``, ``3.1e14`` -> ``310 TFLOPs``."""
    for unit, scale in (("PFLOPs", 1e15), ("TFLOPs", 1e12), ("GFLOPs", 1e9), ("MFLOPs", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOPs"
