"""Kernel launches: HTA's launch table and the launch-bound verdict, which two kinds read.

``launch_bound`` reports the verdict (:func:`launch_waits`, :func:`is_launch_bound`) with its
evidence; ``gpu_idle`` leaves the host-wait gaps to it when, at the documented thresholds, it
fires.  They live here, not in ``launch_bound``, because the kinds are plugins: no kind imports
another.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchprof_args.analysis.analyzers.event_names import LAUNCH_RE
from torchprof_args.analysis.analyzers.gpu import hta_kernels
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import StepContext
from torchprof_args.analysis.diagnose.context import KindContext
from torchprof_args.analysis.diagnose.finding import Threshold
from torchprof_args.analysis.diagnose.spans import host_wait_gaps, unexplained
from torchprof_args.analysis.intervals import Intervals
from torchprof_args.analysis.trace import Trace

__all__ = ["LAUNCH_BOUND_THRESHOLD", "SHORT_SHARE", "LaunchWaits", "is_launch_bound", "launch_stats",
           "launch_waits", "short_share"]

#: ``launch_bound``'s threshold: the host-wait idle time the loader and synchronisations do not
#: explain must reach 5 % of the step ...
LAUNCH_BOUND_THRESHOLD = Threshold(share_of_step=0.05)
#: ... and at least this share of the kernels must run shorter than their launch call (else kernel
#: runtime, not launching, is the limit); off with the thresholds.
SHORT_SHARE = 0.5


def launch_stats(trace: Trace) -> dict[str, np.ndarray]:
    """HTA's kernel launch table, one row per kernel launched by a launch call (``LAUNCH_RE``):
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


def short_share(stats: dict[str, np.ndarray]) -> float:
    """The share of the launch table's kernels that run shorter than their launch call."""
    n = len(stats["correlation"])
    return float((stats["gpu_duration"] < stats["cpu_duration"]).sum()) / n if n else 0.0


@dataclass(frozen=True)
class LaunchWaits:
    """What the launch-bound verdict is taken on, for one rank's steps.

    Attributes:
        gaps: the host-wait gaps (:func:`~.spans.host_wait_gaps`).
        next_kernel: per gap, its next kernel's index into the step context's kernels (-1: none).
        unexplained_us: the gaps' time the loader and synchronisations do not explain.
        stats: the launch table (:func:`launch_stats`).
    """

    gaps: Intervals
    next_kernel: np.ndarray
    unexplained_us: float
    stats: dict[str, np.ndarray]


def launch_waits(trace: Trace, ctx: StepContext) -> LaunchWaits:
    """The host-wait gaps of ``trace``'s steps, their time nothing else explains, the launch table."""
    gaps, nxt = host_wait_gaps(trace, ctx)
    return LaunchWaits(gaps, nxt, unexplained(trace, ctx, gaps), launch_stats(trace))


def is_launch_bound(waits: LaunchWaits, ctx: StepContext, kind_ctx: KindContext) -> bool:
    """Whether the GPU starves for launches: the unexplained host-wait time reaches
    :data:`LAUNCH_BOUND_THRESHOLD` and at least :data:`SHORT_SHARE` of the kernels are shorter
    than their launch (both off with ``kind_ctx``'s thresholds)."""
    wait_us = waits.unexplained_us
    least_short = 0.0 if kind_ctx.thresholds_off else SHORT_SHARE
    return kind_ctx.threshold(LAUNCH_BOUND_THRESHOLD).reached(ctx.ms(wait_us), ctx.share(wait_us)) \
        and short_share(waits.stats) >= least_short
