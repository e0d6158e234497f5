"""``launch_bound``: the GPU starved because the CPU launches kernels too slowly.

HTA's CUDA kernel launch statistics (:func:`launch_stats`, compared with HTA in the tests): per
kernel, its launch call's CPU duration, its GPU duration and the launch delay (kernel start minus
launch end).  The finding measures what that costs: *host-wait* idle time, the GPU idle gaps
whose next kernel was not even launched when the GPU went idle (HTA's idle-time rule, on the
whole GPU rather than per stream), less the gaps data loading and host synchronisations explain
(their own kinds).  It fires when that time reaches the threshold and most kernels are shorter
than their launch call (kernel runtime, not queueing, is the limit otherwise).  Where CUDA graphs
already replay part of the step (kernels launched by ``cudaGraphLaunch``, :func:`graph_replays`),
the advice is to capture more of it, not to start using them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.event_names import GRAPH_LAUNCH_RE, LAUNCH_RE
from torchprof_args.analysis.analyzers.gpu import hta_kernels
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import (
    StepContext,
    context,
    host_wait,
    top_names,
    worst_ts,
)
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold, no_gpu_gap
from torchprof_args.analysis.diagnose.kinds.dataloader_stall import loader_spans
from torchprof_args.analysis.diagnose.kinds.host_sync import claimed
from torchprof_args.analysis.intervals import Intervals, merge_intervals, overlap, total
from torchprof_args.analysis.trace import Trace

__all__ = [
    "GRAPHS_REMEDY", "KIND", "LAUNCH_RE", "SCOPE", "SHORT_SHARE", "THRESHOLD", "analyze", "graph_replays",
    "host_wait_gaps", "launch_stats", "unexplained",
]

KIND = "launch_bound"
SCOPE = Scope.PER_RANK
#: the host-wait idle time the loader and synchronisations do not explain must reach 5 % of the step ...
THRESHOLD = Threshold(share_of_step=0.05)
#: ... and at least this share of the kernels must run shorter than their launch call (else kernel
#: runtime, not launching, is the limit); off with the thresholds.
SHORT_SHARE = 0.5
REMEDY = ("capture the step in CUDA graphs (Megatron-LM --cuda-graph-impl local or transformer_engine, "
          "torch.compile mode='reduce-overhead'), fuse small kernels (torch.compile), or raise the "
          "micro-batch size")
#: the remedy where CUDA graphs already replay part of the step: the waits are outside them.
GRAPHS_REMEDY = ("CUDA graphs already replay part of the step; the GPU waits for the kernels launched "
                 "outside them: capture more of the step (Megatron-LM --cuda-graph-scope, up to "
                 "full_iteration with --cuda-graph-impl local; torch.compile mode='reduce-overhead' over "
                 "the whole model), fuse the eager kernels between graphs (torch.compile), or raise the "
                 "micro-batch size")


def launch_stats(trace: Trace) -> dict[str, np.ndarray]:
    """HTA's kernel launch table, one row per kernel launched by a launch call (:data:`LAUNCH_RE`):
    ``correlation``, ``cpu_duration``, ``gpu_duration``, ``launch_delay`` (us, negative clipped
    to 0).  As HTA: the events of its trace filter (the last step dropped,
    :func:`torchprof_args.analysis.analyzers.gpu.hta_kernels`) and its rounding (``ceil(ts)``,
    ``floor(end)``).  HIP launch calls count too (HTA knows CUDA's names only, so it finds no
    launches in a ROCm trace)."""
    kept, dropped_last = hta_kernels(trace)
    cpu = lookup(trace.names, LAUNCH_RE.match)[trace.name_id] & (trace.stream == -1)
    if dropped_last:
        cpu &= trace.ts <= float(np.ceil(_last_step_start(trace))) - 1.0
    cpu = np.flatnonzero(cpu)
    gpu = np.flatnonzero(kept & (trace.corr >= 0))
    corr_cpu = trace.corr[cpu]
    order = np.argsort(corr_cpu, kind="stable")
    cpu, corr_cpu = cpu[order], corr_cpu[order]
    pos = np.minimum(np.searchsorted(corr_cpu, trace.corr[gpu]), max(len(cpu) - 1, 0))
    hit = (corr_cpu[pos] == trace.corr[gpu]) if len(cpu) else np.zeros(len(gpu), dtype=bool)
    gpu, launch = gpu[hit], cpu[pos[hit]]
    g_ts, g_end = np.ceil(trace.ts[gpu]), np.floor(trace.ts[gpu] + trace.dur[gpu])
    c_ts, c_end = np.ceil(trace.ts[launch]), np.floor(trace.ts[launch] + trace.dur[launch])
    return {"correlation": trace.corr[gpu], "cpu_duration": c_end - c_ts, "gpu_duration": g_end - g_ts,
            "launch_delay": np.maximum(g_ts - c_end, 0.0)}


def _last_step_start(trace: Trace) -> float:
    is_step = lookup(trace.names, lambda n: "ProfilerStep" in n)[trace.name_id] & (trace.stream == -1)
    return float(trace.ts[is_step].max())


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
    return {"launches": n, "short_kernels_share": round(_short_share(stats), 3),
            "launch_delay_mean_us": round(float(delay.mean()), 2) if n else None,
            "launch_delay_p95_us": round(float(np.percentile(delay, 95)), 2) if n else None,
            "runtime_outliers": int((stats["cpu_duration"] > 50).sum()),
            "launch_delay_outliers": int((delay > 100).sum())}


def _short_share(stats: dict[str, np.ndarray]) -> float:
    n = len(stats["correlation"])
    return float((stats["gpu_duration"] < stats["cpu_duration"]).sum()) / n if n else 0.0


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """Host-wait idle per step not explained by loading or synchronisation.

    Args:
        trace: one rank's trace.
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; a gap on a trace without kernels; None below :data:`THRESHOLD` or when fewer
        than :data:`SHORT_SHARE` of the kernels are shorter than their launch.
    """
    ctx = context(trace)
    if not ctx.has_gpu:
        return no_gpu_gap(KIND)
    gaps, nxt = host_wait_gaps(trace, ctx)
    wait_us = unexplained(trace, ctx, gaps)
    stats = launch_stats(trace)
    short_share = 0.0 if kind_ctx.thresholds_off else SHORT_SHARE
    if not kind_ctx.threshold(THRESHOLD).reached(ctx.ms(wait_us), ctx.share(wait_us)) \
            or _short_share(stats) < short_share:
        return None
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
                f"launch kernels; {100 * _short_share(stats):.0f} % of kernels are shorter than their launch"
                + in_graphs,
        ms_per_step=ms, share_of_step=ctx.share(wait_us), saving_ms_per_step=ms,
        saving_bound="host-wait idle time (faster launches or CUDA graphs remove at most this)",
        remedy=REMEDY if graphs is None else GRAPHS_REMEDY, evidence=evidence)
