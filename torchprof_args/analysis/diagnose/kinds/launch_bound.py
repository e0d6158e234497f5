"""``launch_bound``: the GPU starved because the CPU launches kernels too slowly.

HTA's CUDA kernel launch statistics (:func:`~..launches.launch_stats`, compared with HTA in the
tests): per kernel, its launch call's CPU duration, its GPU duration and the launch delay (kernel
start minus launch end).  The finding measures what that costs: *host-wait* idle time, the GPU idle
gaps whose next kernel was not even launched when the GPU went idle (HTA's idle-time rule, on the
whole GPU rather than per stream), less the gaps data loading and host synchronisations explain
(their own kinds).  It fires when that time reaches the threshold and most kernels are shorter
than their launch call (kernel runtime, not queueing, is the limit otherwise): the verdict is
:mod:`..launches`', which ``gpu_idle`` reads too.  Where CUDA graphs already replay part of the
step (kernels launched by ``cudaGraphLaunch``, :func:`graph_replays`), the advice is to capture
more of it, not to start using them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.event_names import GRAPH_LAUNCH_RE
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import StepContext, context, top_names, worst_ts
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, no_gpu_gap
from torchprof_args.analysis.diagnose.launches import (
    LAUNCH_BOUND_THRESHOLD,
    is_launch_bound,
    launch_waits,
    short_share,
)
from torchprof_args.analysis.trace import Trace

__all__ = ["GRAPHS_REMEDY", "KIND", "SCOPE", "THRESHOLD", "analyze", "graph_replays"]

KIND = "launch_bound"
SCOPE = Scope.PER_RANK
#: the host-wait idle time the loader and synchronisations do not explain must reach 5 % of the step,
#: and at least half the kernels must run shorter than their launch call (``launches.SHORT_SHARE``;
#: ``gpu_idle`` takes the same verdict, so both live in :mod:`..launches`).
THRESHOLD = LAUNCH_BOUND_THRESHOLD
REMEDY = ("capture the step in CUDA graphs (Megatron-LM --cuda-graph-impl local or transformer_engine, "
          "torch.compile mode='reduce-overhead'), fuse small kernels (torch.compile), or raise the "
          "micro-batch size")
#: the remedy where CUDA graphs already replay part of the step: the waits are outside them.
GRAPHS_REMEDY = ("CUDA graphs already replay part of the step; the GPU waits for the kernels launched "
                 "outside them: capture more of the step (Megatron-LM --cuda-graph-scope, up to "
                 "full_iteration with --cuda-graph-impl local; torch.compile mode='reduce-overhead' over "
                 "the whole model), fuse the eager kernels between graphs (torch.compile), or raise the "
                 "micro-batch size")


def graph_replays(trace: Trace, ctx: StepContext) -> dict[str, Any] | None:
    """What CUDA graphs replay in the steps: ``graph_launches_per_step`` (``cudaGraphLaunch`` calls),
    ``kernels_replayed`` (the kernels launched by them, each with its call's correlation id) and
    ``replayed_gpu_share`` (their share of the kernels' time); None when no kernel was replayed."""
    launched = ctx.launch >= 0
    replayed = np.zeros(len(ctx.kernels), dtype=bool)
    replayed[launched] = lookup(trace.names, GRAPH_LAUNCH_RE.match)[trace.name_id[ctx.launch[launched]]]
    if not replayed.any():
        return None
    busy = ctx.k_end - ctx.k_ts
    return {"graph_launches_per_step": round(len(np.unique(ctx.launch[replayed])) / ctx.n_steps, 2),
            "kernels_replayed": int(replayed.sum()), "kernels": len(ctx.kernels),
            "replayed_gpu_share": round(float(busy[replayed].sum() / max(busy.sum(), 1e-9)), 3)}


def _evidence(trace: Trace, ctx: StepContext, stats: dict[str, np.ndarray]) -> dict[str, Any]:
    n = len(stats["correlation"])
    delay = stats["launch_delay"]
    return {"launches": n, "short_kernels_share": round(short_share(stats), 3),
            "launch_delay_mean_us": round(float(delay.mean()), 2) if n else None,
            "launch_delay_p95_us": round(float(np.percentile(delay, 95)), 2) if n else None,
            "runtime_outliers": int((stats["cpu_duration"] > 50).sum()),
            "launch_delay_outliers": int((delay > 100).sum())}


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """Host-wait idle per step not explained by loading or synchronisation.

    Args:
        trace: one rank's trace.
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; a gap on a trace without kernels; None below :data:`THRESHOLD` or when fewer
        than ``launches.SHORT_SHARE`` of the kernels are shorter than their launch.
    """
    ctx = context(trace)
    if not ctx.has_gpu:
        return no_gpu_gap(KIND)
    found = launch_waits(trace, ctx)
    if not is_launch_bound(found, ctx, kind_ctx):
        return None
    gaps, nxt, wait_us, stats = found.gaps, found.next_kernel, found.unexplained_us, found.stats
    ms = ctx.ms(wait_us)
    after = nxt >= 0
    waits = (gaps[1] - gaps[0])[after]
    graphs = graph_replays(trace, ctx)
    evidence = {**ctx.evidence(), **_evidence(trace, ctx, stats),
                "top_kernels_after_wait": top_names(trace, ctx.kernels[nxt[after]], waits, ctx),
                "perfetto_ts_us": worst_ts(*gaps), **({} if graphs is None else {"cuda_graphs": graphs})}
    in_graphs = "" if graphs is None else (
        f"; CUDA graphs already replay {100 * graphs['replayed_gpu_share']:.0f} % of the kernels' time")
    return Finding(
        kind=KIND, ranks=(trace.rank or 0,),
        summary=f"the GPU waits {ms:.1f} ms per step ({100 * ctx.share(wait_us):.0f} %) for the CPU to "
                f"launch kernels; {100 * short_share(stats):.0f} % of kernels are shorter than their launch"
                + in_graphs,
        ms_per_step=ms, share_of_step=ctx.share(wait_us), saving_ms_per_step=ms,
        saving_bound="host-wait idle time (faster launches or CUDA graphs remove at most this)",
        remedy=REMEDY if graphs is None else GRAPHS_REMEDY, evidence=evidence)
