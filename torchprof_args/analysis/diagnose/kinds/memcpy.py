"""``memcpy``: host/device copies on the step's critical path.

Copies are the GPU's ``Memcpy HtoD`` / ``Memcpy DtoH`` events (device-to-device copies are GPU work, not
transfers).  A copy is on the critical path for the part of it no computation kernel overlaps (HTA's
kernel classes, :mod:`torchprof_args.analysis.analyzers.gpu`): that part delays the step unless it is
moved off it.  Pageable host memory (``Pageable`` in the copy's name) makes a copy synchronous and slower;
the evidence splits it out.
"""

from __future__ import annotations

import numpy as np

from torchprof_args.analysis.analyzers.event_names import COPY_RE
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import context, top_names
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold, no_gpu_gap
from torchprof_args.analysis.diagnose.spans import compute_union
from torchprof_args.analysis.intervals import covered
from torchprof_args.analysis.trace import Trace

__all__ = ["COPY_RE", "KIND", "SCOPE", "THRESHOLD", "analyze"]

KIND = "memcpy"
SCOPE = Scope.PER_RANK
#: the copies' time no computation kernel overlaps must reach 3 % of the step.
THRESHOLD = Threshold(share_of_step=0.03)
REMEDY = ("pin host memory (pin_memory=True) and copy with non_blocking=True so copies overlap compute; "
          "keep tensors on the GPU between steps")


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """Copy time per step not overlapped by computation.

    Args:
        trace: one rank's trace.
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; a gap on a trace without kernels; None below :data:`THRESHOLD`.
    """
    ctx = context(trace)
    if not ctx.has_gpu:
        return no_gpu_gap(KIND)
    sel = np.flatnonzero(lookup(trace.names, COPY_RE.search)[trace.name_id[ctx.kernels]])
    if len(sel) == 0:
        return None
    ts, end, idx = ctx.k_ts[sel], ctx.k_end[sel], ctx.kernels[sel]
    exposed = (end - ts) - covered(compute_union(trace, ctx), ts, end)
    exposed_us = float(exposed.sum())
    if not kind_ctx.threshold(THRESHOLD).reached(ctx.ms(exposed_us), ctx.share(exposed_us)):
        return None
    pageable = lookup(trace.names, lambda n: "Pageable" in n)[trace.name_id[idx]]
    worst = int(np.argmax(exposed))
    ms = ctx.ms(exposed_us)
    evidence = {**ctx.evidence(), "copies_per_step": round(len(sel) / ctx.n_steps, 2),
                "pageable_ms_per_step": round(ctx.ms(float(exposed[pageable].sum())), 3),
                "top_copies": top_names(trace, idx, exposed, ctx),
                "perfetto_ts_us": round(float(ts[worst]), 3)}
    return Finding(
        kind=KIND, ranks=(trace.rank or 0,),
        summary=f"host/device copies not overlapped by compute take {ms:.1f} ms per step "
                f"({100 * ctx.share(exposed_us):.0f} %)",
        ms_per_step=ms, share_of_step=ctx.share(exposed_us), saving_ms_per_step=ms,
        saving_bound="the copies' time no computation kernel overlaps (overlapping them hides at most this)",
        remedy=REMEDY, evidence=evidence)
