"""``gpu_idle``: time in the step when no kernel runs on the GPU, with HTA's breakdown.

HTA's idle-time breakdown (:func:`idle_time_breakdown`, compared with HTA in the tests) splits,
per stream, each gap before a kernel into *host wait* (the kernel's launch call started after
the previous kernel ended: the CPU had not enqueued it), *kernel wait* (a gap shorter than
``consecutive_kernel_delay``, 30 us: back-to-back launch overhead) and *other* (e.g. waiting on
an event from another stream).  The finding applies the same rule to the whole GPU (all streams
together: the device is idle only when no stream runs), per mean step.

The finding is the symptom; other kinds name causes.  Its saving is the idle time no more
specific finding explains: the data loader's spans (``dataloader_stall``), host
synchronisations (``host_sync``) and, when ``launch_bound`` fires, its host-wait gaps, so a
cause is not counted twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.gpu import hta_kernels
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import (
    KERNEL_CATS,
    StepContext,
    context,
    host_wait,
    top_names,
    worst_ts,
)
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold, no_gpu_gap
from torchprof_args.analysis.diagnose.launches import is_launch_bound, launch_waits
from torchprof_args.analysis.diagnose.spans import claimed, loader_spans
from torchprof_args.analysis.intervals import Intervals, merge_intervals, overlap, total
from torchprof_args.analysis.trace import Trace

__all__ = [
    "CONSECUTIVE_KERNEL_DELAY_US", "KIND", "SCOPE", "THRESHOLD", "analyze", "classify_gaps",
    "idle_time_breakdown",
]

KIND = "gpu_idle"
SCOPE = Scope.PER_RANK
#: the idle time no other kind explains (the finding's saving) must reach 5 % of the step.
THRESHOLD = Threshold(share_of_step=0.05)
#: HTA's ``consecutive_kernel_delay``: shorter gaps are launch overhead ("kernel wait").
CONSECUTIVE_KERNEL_DELAY_US = 30.0
IDLE_CAUSES = ("host_wait", "kernel_wait", "other")
REMEDY = ("keep the GPU fed: see the host-wait / other split; overlap data loading and communication, "
          "remove synchronisations, fuse kernels or use CUDA graphs")


def idle_time_breakdown(trace: Trace,
                        delay_us: float = CONSECUTIVE_KERNEL_DELAY_US) -> dict[int, dict[str, float]]:
    """HTA's ``get_idle_time_breakdown``: per stream, idle time (us) by category.  As HTA: over its
    trace filter (kernels launched before the last step,
    :func:`torchprof_args.analysis.analyzers.gpu.hta_kernels`), with its rounding (``ceil(ts)``,
    ``floor(end)``)."""
    kept, _ = hta_kernels(trace)
    sel = np.flatnonzero(lookup(trace.cats, KERNEL_CATS)[trace.cat_id] & kept)
    launch = np.ceil(_runtime_ts(trace, sel))
    out: dict[int, dict[str, float]] = {}
    for stream in np.unique(trace.stream[sel]):
        s = sel[trace.stream[sel] == stream]
        order = np.argsort(trace.ts[s], kind="stable")
        s, runtime = s[order], launch[trace.stream[sel] == stream][order]
        end = np.floor(trace.ts[s] + trace.dur[s])
        gap = np.ceil(trace.ts[s][1:]) - end[:-1]
        host = runtime[1:] > end[:-1]
        kernel = ~host & (gap < delay_us)
        out[int(stream)] = {"host_wait": float(gap[host].sum()), "kernel_wait": float(gap[kernel].sum()),
                            "other": float(gap[~host & ~kernel].sum())}
    return out


def _runtime_ts(trace: Trace, sel: np.ndarray) -> np.ndarray:
    """Start of each kernel's correlated CPU event (NaN when none), as HTA joins them."""
    cpu = np.flatnonzero((trace.stream == -1) & (trace.corr > 0))
    corr = trace.corr[cpu]
    order = np.argsort(corr, kind="stable")
    cpu, corr = cpu[order], corr[order]
    out = np.full(len(sel), np.nan)
    if len(cpu) == 0:
        return out
    want = trace.corr[sel]
    pos = np.minimum(np.searchsorted(corr, want), len(corr) - 1)
    hit = corr[pos] == want
    out[hit] = trace.ts[cpu[pos[hit]]]
    return out


def classify_gaps(trace: Trace, ctx: StepContext,
                  delay_us: float = CONSECUTIVE_KERNEL_DELAY_US) -> np.ndarray:
    """Category index (into ``IDLE_CAUSES``) of each of the GPU's idle gaps in the steps (the GPU as
    a whole); a gap with no kernel after it in the steps is host wait (nothing was launched)."""
    wait, _ = host_wait(trace, ctx)
    kernel = ~wait & (ctx.idle[1] - ctx.idle[0] < delay_us)
    return np.where(wait, 0, np.where(kernel, 1, 2))


def _explained(trace: Trace, ctx: StepContext) -> Intervals:
    parts = [loader_spans(trace, ctx), claimed(trace, ctx)]
    launches = launch_waits(trace, ctx)
    if is_launch_bound(launches, ctx, DEFAULT_CONTEXT):  # as launch_bound decides, at its thresholds
        parts.append(launches.gaps)
    return merge_intervals(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """GPU idle time per step and its breakdown.

    Args:
        trace: one rank's trace.
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; a gap on a trace without kernels; None when the idle time no other kind
        explains is below :data:`THRESHOLD`.
    """
    ctx = context(trace)
    if not ctx.has_gpu:
        return no_gpu_gap(KIND)
    idle_us = total(ctx.idle)
    left_us = idle_us - overlap(ctx.idle, _explained(trace, ctx))
    if not kind_ctx.threshold(THRESHOLD).reached(ctx.ms(left_us), ctx.share(left_us)):
        return None
    category = classify_gaps(trace, ctx)
    lengths = ctx.idle[1] - ctx.idle[0]
    breakdown = {name: round(ctx.ms(float(lengths[category == i].sum())), 3)
                 for i, name in enumerate(IDLE_CAUSES)}
    ms = ctx.ms(idle_us)
    evidence: dict[str, Any] = {**ctx.evidence(), "breakdown_ms_per_step": breakdown,
                                "gaps_per_step": round(len(lengths) / ctx.n_steps, 2),
                                "top_kernels_after_idle": _after(trace, ctx, lengths),
                                "perfetto_ts_us": worst_ts(*ctx.idle)}
    return Finding(
        kind=KIND, ranks=(trace.rank or 0,),
        summary=f"the GPU is idle {ms:.1f} ms per step ({100 * ctx.share(idle_us):.0f} %): "
                + ", ".join(f"{k.replace('_', ' ')} {v:.1f} ms" for k, v in breakdown.items()),
        ms_per_step=ms, share_of_step=ctx.share(idle_us), saving_ms_per_step=ctx.ms(left_us),
        saving_bound="idle time no more specific finding (loader, synchronisation, launches) explains",
        remedy=REMEDY, evidence=evidence)


def _after(trace: Trace, ctx: StepContext, lengths: np.ndarray) -> list[dict[str, Any]]:
    _, nxt = host_wait(trace, ctx)
    ok = nxt >= 0
    return top_names(trace, ctx.kernels[nxt[ok]], lengths[ok], ctx)
