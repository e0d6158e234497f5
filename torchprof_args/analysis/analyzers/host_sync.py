"""``host_sync``: the CPU blocked on the GPU inside the step.

``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` / ``cudaEventSynchronize`` (and their HIP
names) and blocking device-to-host copies (the runtime call of a ``Memcpy DtoH``: ``.item()``,
``.cpu()``, ``.tolist()``).  While the CPU waits it enqueues nothing, so once the queue drains
the GPU idles until the CPU launches again.  A synchronisation's cost is the GPU idle time while it
blocks and, when it found the GPU busy (it waited for the queue to drain), from its return to the
next kernel (the copy's own GPU time is the ``memcpy`` kind's); the time blocked is reported
beside it.  With ``--torch-profile-with-stack`` each is
tied to its Python call site.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from torchprof_args.analysis.analyzers.callsites import STACK_FLAG, call_sites, has_stacks
from torchprof_args.analysis.analyzers.intervals import merge_intervals
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import (
    NO_LAUNCH,
    Intervals,
    StepContext,
    context,
    covered,
    cpu_spans,
    empty,
    events_named,
    no_gpu_gap,
    top_names,
)
from torchprof_args.analysis.findings import Finding, Gap
from torchprof_args.analysis.trace import Trace

__all__ = ["SYNC_RE", "THRESHOLD", "analyze", "claimed", "sync_events"]

#: below this share of the step (GPU idle caused), no finding.
THRESHOLD = 0.02
SYNC_RE = re.compile(r"^(cuda|hip)(Stream|Device|Event|Ctx)Synchroni[sz]e$")
DTOH_RE = re.compile(r"DtoH|Device -> (Pageable|Pinned|Host)")


def sync_events(trace: Trace, ctx: StepContext | None = None) -> np.ndarray:
    """Indices of the blocking calls within the steps: synchronisations and the runtime calls of
    device-to-host copies."""
    ctx = ctx or context(trace)
    syncs = events_named(trace, SYNC_RE)
    is_dtoh = lookup(trace.names, DTOH_RE.search)[trace.name_id[ctx.kernels]]
    copies = ctx.launch[is_dtoh & (ctx.launch != NO_LAUNCH)]
    idx = np.union1d(syncs, copies).astype(np.int64)
    return idx[(trace.ts[idx] < ctx.end) & (trace.ts[idx] + trace.dur[idx] > ctx.start)]


def claimed(trace: Trace, ctx: StepContext | None = None) -> Intervals:
    """The union of each blocking call's window, its start to the first kernel after it returns
    (the idle time this kind accounts for; ``gpu_idle`` and ``launch_bound`` leave it alone)."""
    ctx = ctx or context(trace)
    idx = sync_events(trace, ctx)
    if len(idx) == 0 or not ctx.has_gpu:
        return empty()
    ts = trace.ts[idx]
    return merge_intervals(ts, _stop(ctx, ts, ts + trace.dur[idx]))


def _stop(ctx: StepContext, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per call, the end of its window: when the GPU was busy as it began (it waited for the GPU
    to drain), the end of the idle gap it returns into (the CPU had queued nothing meanwhile);
    else its own end (a call that finds the GPU idle delays nothing after it returns)."""
    idle_s, idle_e = ctx.idle
    if len(idle_s) == 0:
        return end
    busy_at_start = covered(ctx.busy, ts, np.minimum(ts + 1.0, end)) > 0
    j = np.searchsorted(idle_s, end, side="right") - 1
    last = idle_e[np.maximum(j, 0)]
    return np.where(busy_at_start & (j >= 0) & (last > end), last, end)


def _idle_caused(ctx: StepContext, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per call, the GPU idle time from its start to the first kernel after it returns."""
    return covered(ctx.idle, ts, _stop(ctx, ts, end))


def analyze(trace: Trace, threshold: float = THRESHOLD) -> Finding | Gap | None:
    """The GPU idle time host synchronisations cause per step; None below ``threshold``."""
    ctx = context(trace)
    if not ctx.has_gpu:
        return no_gpu_gap("host_sync")
    idx = sync_events(trace, ctx)
    if len(idx) == 0:
        return None
    ts, end = trace.ts[idx], trace.ts[idx] + trace.dur[idx]
    cost = _idle_caused(ctx, ts, end)
    caused_us = float(cost.sum())
    if ctx.share(caused_us) < threshold:
        return None
    blocked = cpu_spans(trace, idx, ctx)
    blocked_us = float((blocked[1] - blocked[0]).sum())
    worst = int(np.argmax(cost))
    evidence = {**ctx.evidence(), "blocked_ms_per_step": round(ctx.ms(blocked_us), 3),
                "calls_per_step": round(len(idx) / ctx.n_steps, 2),
                "top_calls": top_names(trace, idx, cost, ctx), "perfetto_ts_us": round(float(ts[worst]), 3)}
    remedy = "remove the host synchronisation (.item(), .cpu(), torch.cuda.synchronize()) from the step"
    if has_stacks(trace):
        sites = _by_site(idx, cost, call_sites(trace, idx), ctx)
        evidence["call_sites"] = sites
        if sites and sites[0]["name"] != "unknown":
            remedy = f"remove the synchronisation (.item() / .cpu() / synchronize) at {sites[0]['name']}"
    else:
        evidence["call_sites_need"] = STACK_FLAG
    ms = ctx.ms(caused_us)
    return Finding(
        kind="host_sync", ranks=(trace.rank or 0,),
        summary=f"host synchronisations leave the GPU idle {ms:.1f} ms per step "
                f"({100 * ctx.share(caused_us):.0f} %)",
        ms_per_step=ms, share_of_step=ctx.share(caused_us), saving_ms_per_step=ms,
        saving_bound="GPU idle from each synchronisation to the next kernel after it",
        remedy=remedy, evidence=evidence)


def _by_site(idx: np.ndarray, cost: np.ndarray, sites: list[str | None], ctx: StepContext,
             top: int = 3) -> list[dict[str, float | str]]:
    sums: dict[str, float] = defaultdict(float)
    for site, us in zip(sites, cost.tolist(), strict=True):
        sums[site or "unknown"] += us
    ranked = sorted(sums.items(), key=lambda kv: -kv[1])[:top]
    return [{"name": name, "ms_per_step": round(ctx.ms(us), 3)} for name, us in ranked]
