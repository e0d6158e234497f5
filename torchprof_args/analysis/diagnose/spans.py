"""The spans of one rank's steps that more than one diagnose kind reads.

A kind that explains some of the GPU's idle time owns it; the kinds that measure a wider symptom
leave it out, so no time is counted twice: the data loader's spans (:func:`loader_spans`,
``dataloader_stall``'s), the blocking calls' windows (:func:`claimed`, ``host_sync``'s) and the
host-wait gaps (:func:`host_wait_gaps`, ``launch_bound``'s), less the first two
(:func:`unexplained`).  The computation kernels' union (:func:`compute_union`) is what hides
copies (``memcpy``) and communication (``exposed_comm``).  They live here, not in one kind, because
the kinds are plugins: no kind imports another.
"""

from __future__ import annotations

import numpy as np

from torchprof_args.analysis.analyzers.event_names import DTOH_RE, LOADER_RE, SYNC_RE
from torchprof_args.analysis.analyzers.gpu import COMPUTATION, kernel_type
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import (
    NO_LAUNCH,
    StepContext,
    context,
    cpu_spans,
    events_named,
    host_wait,
)
from torchprof_args.analysis.intervals import Intervals, covered, empty, merge_intervals, overlap, total
from torchprof_args.analysis.trace import Trace

__all__ = ["claimed", "compute_union", "host_wait_gaps", "loader_spans", "sync_events", "sync_window_end",
           "unexplained"]


def loader_spans(trace: Trace, ctx: StepContext | None = None) -> Intervals:
    """The union of the data loader's spans within the steps."""
    ctx = ctx or context(trace)
    return cpu_spans(trace, events_named(trace, LOADER_RE), ctx)


def sync_events(trace: Trace, ctx: StepContext | None = None) -> np.ndarray:
    """Indices of the blocking calls within the steps: synchronisations and the runtime calls of
    device-to-host copies."""
    ctx = ctx or context(trace)
    syncs = events_named(trace, SYNC_RE)
    is_dtoh = lookup(trace.names, DTOH_RE.search)[trace.name_id[ctx.kernels]]
    copies = ctx.launch[is_dtoh & (ctx.launch != NO_LAUNCH)]
    idx = np.union1d(syncs, copies).astype(np.int64)
    return idx[(trace.ts[idx] < ctx.end) & (trace.ts[idx] + trace.dur[idx] > ctx.start)]


def sync_window_end(ctx: StepContext, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per blocking call (start ``ts``, end ``end``), the end of its window: when the GPU was busy
    as it began (it waited for the GPU to drain), the end of the idle gap it returns into (the CPU
    had queued nothing meanwhile); else its own end (a call that finds the GPU idle delays nothing
    after it returns)."""
    idle_s, idle_e = ctx.idle
    if len(idle_s) == 0:
        return end
    busy_at_start = covered(ctx.busy, ts, np.minimum(ts + 1.0, end)) > 0
    j = np.searchsorted(idle_s, end, side="right") - 1
    last = idle_e[np.maximum(j, 0)]
    return np.where(busy_at_start & (j >= 0) & (last > end), last, end)


def claimed(trace: Trace, ctx: StepContext | None = None) -> Intervals:
    """The union of each blocking call's window, its start to the first kernel after it returns
    (the idle time ``host_sync`` accounts for; ``gpu_idle`` and ``launch_bound`` leave it alone)."""
    ctx = ctx or context(trace)
    idx = sync_events(trace, ctx)
    if len(idx) == 0 or not ctx.has_gpu:
        return empty()
    ts = trace.ts[idx]
    return merge_intervals(ts, sync_window_end(ctx, ts, ts + trace.dur[idx]))


def compute_union(trace: Trace, ctx: StepContext) -> Intervals:
    """The union of the computation kernels in the steps."""
    is_comp = lookup(trace.names, lambda n: kernel_type(n) == COMPUTATION)[trace.name_id[ctx.kernels]]
    return merge_intervals(ctx.k_ts[is_comp], ctx.k_end[is_comp])


def host_wait_gaps(trace: Trace, ctx: StepContext) -> tuple[Intervals, np.ndarray]:
    """The GPU idle gaps whose next kernel was launched after the gap began (or never, within the
    steps), and that kernel's index into ``ctx.kernels`` (-1 for a gap at the end)."""
    wait, nxt = host_wait(trace, ctx)
    return (ctx.idle[0][wait], ctx.idle[1][wait]), nxt[wait]


def unexplained(trace: Trace, ctx: StepContext, gaps: Intervals) -> float:
    """Time of ``gaps`` that neither the data loader's spans nor host synchronisations explain."""
    other = [loader_spans(trace, ctx), claimed(trace, ctx)]
    starts = np.concatenate([o[0] for o in other])
    ends = np.concatenate([o[1] for o in other])
    return total(gaps) - overlap(gaps, merge_intervals(starts, ends))
