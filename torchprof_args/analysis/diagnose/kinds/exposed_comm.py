"""``exposed_comm``: communication kernel time no computation kernel overlaps.

Kernels are classified by HTA's rules (:mod:`torchprof_args.analysis.analyzers.gpu`: ``^nccl.*Kernel`` is
communication, which covers RCCL's names too); a communication kernel is exposed for the part of it during
which no computation kernel runs (HTA's communication/computation overlap,
:mod:`torchprof_args.analysis.analyzers.overlap`, the other way round).  That part is on the step's
critical path unless the schedule overlaps it.  When the trace was loaded with its communication fields
(``load_trace(..., comms=True)``) the exposed time is split by process group: the group's description
(``Process Group Description``, e.g. Megatron's) names dp / tp / pp / ep.  On an FSDP2 job (the trace
has FSDP2's annotations, :func:`~torchprof_args.analysis.analyzers.fsdp.is_fsdp2`) the data-parallel
remedy is FSDP2's own, for the collective most exposed: the parameters' all-gathers (unshard) or the
gradients' reduce-scatters (and all-reduces under HSDP).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.fsdp import is_fsdp2
from torchprof_args.analysis.analyzers.gpu import COMMUNICATION, kernel_type
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import StepContext, context, top_names
from torchprof_args.analysis.decode.comm_events import COMM_FIELDS
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold, no_gpu_gap
from torchprof_args.analysis.diagnose.spans import compute_union
from torchprof_args.analysis.intervals import covered, merge_intervals, minus
from torchprof_args.analysis.trace import Trace

__all__ = ["FSDP2_REMEDY", "KIND", "SCOPE", "THRESHOLD", "analyze", "fsdp2_exposed", "group_kind"]

KIND = "exposed_comm"
SCOPE = Scope.PER_RANK
#: exposed communication (wall time) must reach 5 % of the step.
THRESHOLD = Threshold(share_of_step=0.05)
_GROUP_PATTERNS = (("tp", re.compile(r"tensor|\btp\b|_tp_|^tp", re.I)),
          ("pp", re.compile(r"pipe|\bpp\b|_pp_|^pp", re.I)),
          ("ep", re.compile(r"expert|\bep\b|_ep_|^ep", re.I)),
          ("cp", re.compile(r"context|\bcp\b|^cp", re.I)),
          ("dp", re.compile(r"data|\bdp\b|_dp_|^dp|fsdp|default", re.I)))
REMEDY = {"dp": "overlap gradient reduction: Megatron --overlap-grad-reduce --overlap-param-gather "
                "(DDP bucket_cap_mb, FSDP prefetch)",
          "tp": "overlap tensor-parallel communication: Megatron --tp-comm-overlap, sequence parallelism",
          "pp": "more micro-batches or an interleaved schedule (--num-layers-per-virtual-pipeline-stage)",
          "ep": "overlap expert dispatch: Megatron --moe-shared-expert-overlap / a2a overlap"}
DEFAULT_REMEDY = ("overlap communication with compute: Megatron --overlap-grad-reduce --overlap-param-gather "
                  "(DDP/FSDP bucketing and prefetch)")
#: an FSDP2 job's remedy, by its collective most exposed (FSDPModule's methods, fully_shard's arguments).
FSDP2_REMEDY = {
    "all_gather": ("issue FSDP2's all-gathers earlier: on each fully_shard-ed block, "
                   "set_modules_to_forward_prefetch([the next two blocks]) and "
                   "set_modules_to_backward_prefetch([the previous two]) (the default prefetches one; each "
                   "more holds one more block's unsharded parameters); fully_shard(last blocks, "
                   "reshard_after_forward=False) skips their all-gather in backward, at the cost of their "
                   "unsharded parameters held from forward to backward"),
    "reduce_scatter": ("reduce-scatter less often and in fewer pieces: with gradient accumulation, "
                       "model.set_requires_gradient_sync(False) for all but the last micro-batch (the "
                       "unsharded gradients are held meanwhile); fully_shard([several blocks]) as one group "
                       "buckets their gradients into one larger reduce-scatter"),
}
#: the kernels of each FSDP2 collective (NCCL's / RCCL's names); all-reduces are HSDP's gradients.
_FSDP2_KERNELS = (("all_gather", re.compile(r"AllGather", re.I)),
                  ("reduce_scatter", re.compile(r"ReduceScatter|AllReduce", re.I)))


def group_kind(desc: str | None) -> str:
    """dp / tp / pp / ep / cp from a process group's description, else ``unknown``."""
    for kind, pattern in _GROUP_PATTERNS:
        if desc and pattern.search(desc):
            return kind
    return "unknown"


def fsdp2_exposed(trace: Trace, names: list[str], exposed_us: list[float]) -> dict[str, float] | None:
    """Exposed time (as given) by FSDP2 collective (:data:`FSDP2_REMEDY`'s keys), most first, of the
    communication kernels ``names``; None when ``trace`` is not an FSDP2 job's."""
    if not is_fsdp2(trace):
        return None
    sums: dict[str, float] = defaultdict(float)
    for name, us in zip(names, exposed_us, strict=True):
        what = next((what for what, pattern in _FSDP2_KERNELS if pattern.search(name)), None)
        if what is not None:
            sums[what] += us
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]))


def _groups(trace: Trace, idx: np.ndarray) -> list[str] | None:
    """Per kernel of ``idx``, its process group's kind (None without communication fields)."""
    if not trace.comms:
        return None
    corr_at, desc_at, name_at = (COMM_FIELDS.index(f) for f in ("corr", "pg_desc", "pg_name"))
    by_corr = {row[corr_at]: row[desc_at] or row[name_at] for row in trace.comms
               if row[desc_at] is not None or row[name_at] is not None}
    return [group_kind(str(by_corr.get(int(c))) if int(c) in by_corr else None) for c in trace.corr[idx]]


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """Exposed communication per step.

    Args:
        trace: one rank's trace (with ``comms=True``, split by process group).
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; a gap on a trace without kernels; None below :data:`THRESHOLD`.
    """
    ctx = context(trace)
    if not ctx.has_gpu:
        return no_gpu_gap(KIND)
    is_comm = lookup(trace.names, lambda n: kernel_type(n) == COMMUNICATION)
    sel = np.flatnonzero(is_comm[trace.name_id[ctx.kernels]])
    if len(sel) == 0:
        return None
    ts, end, idx = ctx.k_ts[sel], ctx.k_end[sel], ctx.kernels[sel]
    compute = compute_union(trace, ctx)
    exposed = (end - ts) - covered(compute, ts, end)  # per kernel, for the evidence
    # several streams may communicate at once: the finding counts wall time, not the kernels' sum
    exposed_us = minus(merge_intervals(ts, end), compute)
    if not kind_ctx.threshold(THRESHOLD).reached(ctx.ms(exposed_us), ctx.share(exposed_us)):
        return None
    ms = ctx.ms(exposed_us)
    worst = int(np.argmax(exposed))
    evidence: dict[str, Any] = {**ctx.evidence(),
                                "communication_ms_per_step": round(ctx.ms(float((end - ts).sum())), 3),
                                "top_kernels": top_names(trace, idx, exposed, ctx),
                                "perfetto_ts_us": round(float(ts[worst]), 3)}
    remedy, top = DEFAULT_REMEDY, "unknown"
    groups = _groups(trace, idx)
    if groups is not None:
        evidence["by_group_ms_per_step"] = _by_group(groups, exposed, ctx)
        top = next(iter(evidence["by_group_ms_per_step"]), "unknown")
        remedy = REMEDY.get(top, DEFAULT_REMEDY)
    fsdp2 = fsdp2_exposed(trace, [trace.names[i] for i in trace.name_id[idx].tolist()], exposed.tolist())
    if fsdp2 is not None and top in ("dp", "unknown"):
        evidence["fsdp2_ms_per_step"] = {what: round(ctx.ms(us), 3) for what, us in fsdp2.items()}
        most = next(iter(fsdp2), None)  # None: the kernels do not name their collective
        remedy = FSDP2_REMEDY[most] if most else "; ".join(FSDP2_REMEDY.values())
    return Finding(
        kind=KIND, ranks=(trace.rank or 0,),
        summary=f"communication not overlapped by compute takes {ms:.1f} ms per step "
                f"({100 * ctx.share(exposed_us):.0f} %)",
        ms_per_step=ms, share_of_step=ctx.share(exposed_us), saving_ms_per_step=ms,
        saving_bound="exposed communication only, if fully overlapped (compute is not shortened)",
        remedy=remedy, evidence=evidence)


def _by_group(groups: list[str], exposed: np.ndarray, ctx: StepContext) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for g, us in zip(groups, exposed.tolist(), strict=True):
        sums[g] += us
    return {g: round(ctx.ms(us), 3) for g, us in sorted(sums.items(), key=lambda kv: -kv[1])}
