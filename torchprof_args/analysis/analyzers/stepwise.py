"""What the diagnose analyzers share: one rank's steps, its GPU kernels and their launches, the
GPU's busy and idle time, and the small helpers that turn totals into per-step evidence.

Every ``diagnose`` kind measures *per mean step*: the region is the ``ProfilerStep#N`` spans
(first start to last end, :mod:`.steps`); a trace without steps is one step (the whole trace),
which the findings say in their evidence (``"whole_trace_as_one_step": true``).  Kernels are the
events with a stream and a kernel / memcpy / memset category (HTA's idle-time selection), clipped
to the region; a kernel's *launch* is the CPU runtime event (``cudaLaunchKernel``,
``hipLaunchKernel``, ``cudaMemcpyAsync``...) with the same correlation id.  The GPU is *busy*
while any kernel runs (all streams together) and *idle* in the rest of the region.  Computed
once per trace (kept in ``trace.memo.diagnose``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.intervals import Intervals, empty, merge_intervals
from torchprof_args.analysis.trace import Trace

__all__ = [
    "KERNEL_CATS", "NO_LAUNCH", "RUNTIME_CATS", "StepContext", "context", "cpu_spans", "events_named",
    "host_wait", "top_names", "worst_ts",
]

#: categories of device-side events (HTA's idle-time breakdown selects the same ones).
KERNEL_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")
#: categories of the CPU runtime calls that launch them.
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
#: a kernel whose launch cannot be found (no correlation).
NO_LAUNCH = -1


@dataclass
class StepContext:
    """One rank's steps and GPU activity, as the diagnose analyzers read them.

    ``kernels``: event indices sorted by start; ``launch``: the index of each one's runtime call
    (``NO_LAUNCH`` if none); ``k_ts`` / ``k_end``: their times clipped to the region.
    """

    n_steps: int
    step_us: float
    start: float
    end: float
    whole_trace: bool
    kernels: np.ndarray
    launch: np.ndarray
    k_ts: np.ndarray
    k_end: np.ndarray
    busy: Intervals
    idle: Intervals
    #: start of the longest step (for Perfetto).
    longest_step_ts: float = 0.0

    @property
    def has_gpu(self) -> bool:
        return len(self.kernels) > 0

    def ms(self, us: float) -> float:
        """``us`` over the region as milliseconds per mean step."""
        return us / 1000.0 / self.n_steps

    def share(self, us: float) -> float:
        """``us`` over the region as a share of the steps' time."""
        return us / (self.step_us * self.n_steps) if self.step_us > 0 else 0.0

    def evidence(self) -> dict[str, Any]:
        """What every finding's evidence says about the steps it averages over."""
        out: dict[str, Any] = {"steps": self.n_steps, "step_ms": round(self.step_us / 1000.0, 3)}
        if self.whole_trace:
            out["whole_trace_as_one_step"] = True
        return out


def context(trace: Trace) -> StepContext:
    """The :class:`StepContext` of ``trace`` (computed once, kept in ``trace.memo``)."""
    if trace.memo.diagnose is None:
        trace.memo.diagnose = _build(trace)
    return trace.memo.diagnose


def _region(trace: Trace) -> tuple[int, float, float, float, bool, float]:
    rows = steps(trace)
    if rows:
        start = rows[0]["start_us"]
        end = max(s["start_us"] + s["dur_us"] for s in rows)
        longest = max(rows, key=lambda s: s["dur_us"])["start_us"]
        return len(rows), float(np.mean([s["dur_us"] for s in rows])), start, end, False, longest
    if trace.ts.size == 0:
        return 1, 0.0, 0.0, 0.0, True, 0.0
    start, end = float(trace.ts.min()), float((trace.ts + trace.dur).max())
    return 1, end - start, start, end, True, start


def _build(trace: Trace) -> StepContext:
    n, step_us, start, end, whole, longest = _region(trace)
    is_kernel = lookup(trace.cats, KERNEL_CATS)[trace.cat_id] & (trace.stream >= 0)
    is_kernel &= (trace.ts < end) & (trace.ts + trace.dur > start)
    kernels = np.flatnonzero(is_kernel)
    kernels = kernels[np.argsort(trace.ts[kernels], kind="stable")]
    k_ts = np.clip(trace.ts[kernels], start, end)
    k_end = np.clip(trace.ts[kernels] + trace.dur[kernels], start, end)
    busy = merge_intervals(k_ts, k_end)
    idle_s, idle_e = np.r_[start, busy[1]], np.r_[busy[0], end]
    keep = idle_e > idle_s
    return StepContext(n, step_us, start, end, whole, kernels, _launches(trace, kernels), k_ts, k_end,
                       busy, (idle_s[keep], idle_e[keep]), longest)


def _launches(trace: Trace, kernels: np.ndarray) -> np.ndarray:
    """Per kernel, the CPU runtime event with its correlation id (``NO_LAUNCH`` when absent)."""
    runtime = np.flatnonzero(lookup(trace.cats, RUNTIME_CATS)[trace.cat_id] & (trace.corr >= 0)
                             & (trace.stream < 0))
    out = np.full(len(kernels), NO_LAUNCH, dtype=np.int64)
    if len(runtime) == 0 or len(kernels) == 0:
        return out
    order = np.argsort(trace.corr[runtime], kind="stable")
    corr_sorted, runtime = trace.corr[runtime][order], runtime[order]
    want = trace.corr[kernels]
    pos = np.minimum(np.searchsorted(corr_sorted, want), len(corr_sorted) - 1)
    found = (corr_sorted[pos] == want) & (want >= 0)
    out[found] = runtime[pos[found]]
    return out


def events_named(trace: Trace, pattern: re.Pattern[str], cpu_only: bool = True) -> np.ndarray:
    """Indices of the events whose name matches ``pattern`` (CPU side only by default)."""
    mask = lookup(trace.names, pattern.search)[trace.name_id]
    if cpu_only:
        mask &= trace.stream < 0
    return np.flatnonzero(mask)


def cpu_spans(trace: Trace, idx: np.ndarray, ctx: StepContext) -> Intervals:
    """The union of events ``idx``, clipped to the steps' region."""
    if len(idx) == 0:
        return empty()
    ts = np.clip(trace.ts[idx], ctx.start, ctx.end)
    end = np.clip(trace.ts[idx] + trace.dur[idx], ctx.start, ctx.end)
    keep = end > ts
    return merge_intervals(ts[keep], end[keep])


def top_names(trace: Trace, idx: np.ndarray, weights: np.ndarray, ctx: StepContext,
              top: int = 3) -> list[dict[str, Any]]:
    """The ``top`` event names among ``idx`` by summed ``weights`` (us), in ms per step."""
    if len(idx) == 0:
        return []
    sums = np.bincount(trace.name_id[idx], weights=weights, minlength=len(trace.names))
    order = np.argsort(-sums, kind="stable")[:top]
    return [{"name": trace.names[i], "ms_per_step": round(ctx.ms(float(sums[i])), 3)}
            for i in order if sums[i] > 0]


def worst_ts(starts: np.ndarray, ends: np.ndarray) -> float | None:
    """Start (us, for Perfetto) of the longest of the intervals, None when there are none."""
    if len(starts) == 0:
        return None
    return round(float(starts[int(np.argmax(ends - starts))]), 3)


def host_wait(trace: Trace, ctx: StepContext) -> tuple[np.ndarray, np.ndarray]:
    """Per idle gap of ``ctx.idle``: whether it is *host wait* (HTA's rule: the next kernel's
    launch call started after the gap began; a gap with no kernel after it in the steps counts
    too, nothing was launched) and the index into ``ctx.kernels`` of that next kernel (-1: none)."""
    idle_s, idle_e = ctx.idle
    nxt = np.searchsorted(ctx.k_ts, idle_e, side="left")
    has_next = nxt < len(ctx.kernels)
    if len(ctx.kernels):
        launch = ctx.launch[np.where(has_next, nxt, 0)]
    else:
        launch = np.zeros(len(nxt), dtype=np.int64)
    launched = np.where(launch != NO_LAUNCH, trace.ts[np.maximum(launch, 0)], -np.inf)
    return ~has_next | (launched > idle_s), np.where(has_next, nxt, -1)
