"""``dataloader_stall``: step time spent waiting for the data loader.

The data loader's spans are the ``enumerate(DataLoader)#...__next__`` annotations torch.profiler
records around every batch fetch (and, with ``--torch-profile-with-stack``, the Python frames of
``torch/utils/data/dataloader.py``'s ``__next__``).  On a GPU trace the stall is the time the GPU
is idle while a loader span runs (a loader that prefetches while the GPU computes costs
nothing); on a CPU-only trace it is the loader spans' whole time, which the step waits for.
"""

from __future__ import annotations

import re

import numpy as np

from torchprof_args.analysis.analyzers.stepwise import (
    Intervals,
    StepContext,
    context,
    covered,
    cpu_spans,
    events_named,
    overlap,
    top_names,
    worst_ts,
)
from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.trace import Trace

__all__ = ["LOADER_RE", "THRESHOLD", "analyze", "loader_spans"]

#: below this share of the step, no finding.
THRESHOLD = 0.03
LOADER_RE = re.compile(r"^enumerate\(DataLoader\)#.*__next__$"
                       r"|torch/utils/data/dataloader\.py\(\d+\): __next__$")
REMEDY = ("pin_memory=True, more DataLoader num_workers (and prefetch_factor), persistent_workers=True; "
          "move heavy preprocessing out of the loop")


def loader_spans(trace: Trace, ctx: StepContext | None = None) -> Intervals:
    """The union of the data loader's spans within the steps."""
    ctx = ctx or context(trace)
    return cpu_spans(trace, events_named(trace, LOADER_RE), ctx)


def analyze(trace: Trace, threshold: float = THRESHOLD) -> Finding | Gap | None:
    """The data loader's stall per step, None below ``threshold`` of the step (no loader spans:
    None, nothing to say)."""
    ctx = context(trace)
    idx = events_named(trace, LOADER_RE)
    spans = cpu_spans(trace, idx, ctx)
    if len(spans[0]) == 0:
        return None
    stall_us = overlap(spans, ctx.idle) if ctx.has_gpu else float((spans[1] - spans[0]).sum())
    if ctx.share(stall_us) < threshold:
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
        kind="dataloader_stall", ranks=(trace.rank or 0,),
        summary=f"{where} {ms:.1f} ms per step ({100 * ctx.share(stall_us):.0f} %) for the data loader",
        ms_per_step=ms, share_of_step=ctx.share(stall_us), saving_ms_per_step=ms,
        saving_bound="the idle time during loader fetches: a loader that keeps ahead saves at most this",
        remedy=REMEDY, evidence=evidence)
