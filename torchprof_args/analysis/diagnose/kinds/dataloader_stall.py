"""``dataloader_stall``: step time spent waiting for the data loader.

The data loader's spans are the ``enumerate(DataLoader)#...__next__`` annotations torch.profiler
records around every batch fetch (and, with ``--torch-profile-with-stack``, the Python frames of
``torch/utils/data/dataloader.py``'s ``__next__``).  On a GPU trace the stall is the time the GPU
is idle while a loader span runs (a loader that prefetches while the GPU computes costs
nothing); on a CPU-only trace it is the loader spans' whole time, which the step waits for.
"""

from __future__ import annotations

import numpy as np

from torchprof_args.analysis.analyzers.event_names import LOADER_RE
from torchprof_args.analysis.analyzers.stepwise import (
    context,
    cpu_spans,
    events_named,
    top_names,
    worst_ts,
)
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
from torchprof_args.analysis.intervals import covered, overlap
from torchprof_args.analysis.trace import Trace

__all__ = ["KIND", "LOADER_RE", "SCOPE", "THRESHOLD", "analyze"]

KIND = "dataloader_stall"
SCOPE = Scope.PER_RANK
#: the stall (GPU idle while the loader runs; CPU-only: the loader's time) must reach 3 % of the step.
THRESHOLD = Threshold(share_of_step=0.03)
REMEDY = ("pin_memory=True, more DataLoader num_workers (and prefetch_factor), persistent_workers=True; "
          "move heavy preprocessing out of the loop")


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The data loader's stall per step.

    Args:
        trace: one rank's trace.
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; None below :data:`THRESHOLD` or without loader spans (nothing to say).
    """
    ctx = context(trace)
    idx = events_named(trace, LOADER_RE)
    spans = cpu_spans(trace, idx, ctx)
    if len(spans[0]) == 0:
        return None
    stall_us = overlap(spans, ctx.idle) if ctx.has_gpu else float((spans[1] - spans[0]).sum())
    if not kind_ctx.threshold(THRESHOLD).reached(ctx.ms(stall_us), ctx.share(stall_us)):
        return None
    ms = ctx.ms(stall_us)
    per_event = covered(ctx.idle, trace.ts[idx], trace.ts[idx] + trace.dur[idx]) if ctx.has_gpu \
        else trace.dur[idx]
    worst = int(np.argmax(per_event))
    evidence = {**ctx.evidence(), "loader_ms_per_step": round(ctx.ms(float((spans[1] - spans[0]).sum())), 3),
                "fetches_per_step": round(len(idx) / ctx.n_steps, 2),
                "top_spans": top_names(trace, idx, per_event, ctx),
                "perfetto_ts_us": worst_ts(trace.ts[idx][worst:worst + 1],
                                           trace.ts[idx][worst:worst + 1] + per_event[worst:worst + 1])}
    where = "the GPU idles" if ctx.has_gpu else "the step waits"
    return Finding(
        kind=KIND, ranks=(trace.rank or 0,),
        summary=f"{where} {ms:.1f} ms per step ({100 * ctx.share(stall_us):.0f} %) for the data loader",
        ms_per_step=ms, share_of_step=ctx.share(stall_us), saving_ms_per_step=ms,
        saving_bound="the idle time during loader fetches: a loader that keeps ahead saves at most this",
        remedy=REMEDY, evidence=evidence)
