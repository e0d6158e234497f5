"""GPU time: temporal breakdown, kernel types and top kernels, with HTA's definitions.

The numbers follow Holistic Trace Analysis (``hta`` 0.5) so they can be compared with it (the
tests do, on real traces):

* kernels are events with a CUDA ``stream``; when the trace has two or more ``ProfilerStep``
  names, only kernels launched (same correlation id) by CPU events that start before the last
  ProfilerStep are kept, plus stream-bearing CPU-side events before it (HTA drops the last,
  usually incomplete, step);
* times are rounded like HTA's parser: ``ts = ceil(ts)``, ``end = floor(ts + dur)``;
* kernel class by name: communication ``^nccl.*Kernel``, memory ``^Memcpy|^Memset|^dma``,
  computation = not matching ``^nccl.*Kernel|.*Memcpy|Memset|.*Sync`` (the rest is "other");
* idle = kernel-active span (first kernel start to last end) minus the union of kernel
  intervals; compute = union of computation kernels; non-compute = span - compute - idle;
* kernel-type totals are exclusive: time where several classes run at once is reported under
  the combined class ("computation overlapping communication") as HTA does.

Communication/computation overlap, computed from the same kernel intervals, is in
:mod:`.overlap`.
"""

from __future__ import annotations

import functools
import re
from typing import TypedDict

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.overlap import comm_comp_overlap
from torchprof_args.analysis.analyzers.select import lookup, member
from torchprof_args.analysis.intervals import Intervals, merge_intervals, time_per_combination, total
from torchprof_args.analysis.trace import Trace

__all__ = [
    "COMMUNICATION", "COMPUTATION", "MEMORY", "OTHER", "GpuBreakdown", "KernelTotal", "KernelTypeTimes",
    "TemporalBreakdown", "gpu_view", "hta_kernels", "kernel_type", "kernel_type_breakdown",
    "temporal_breakdown", "top_kernels",
]

COMM_RE = re.compile(r"^nccl.*Kernel")
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
COMPUTATION, COMMUNICATION, MEMORY, OTHER = "computation", "communication", "memory", "other"

#: bits of the classes whose exclusive times are reported (their ORs name the overlaps).
_TYPE_BITS = {COMPUTATION: 1, COMMUNICATION: 2, MEMORY: 4}
#: kernel class of a name as a small integer, for vectorised selection.
_TYPE_CODES = {COMPUTATION: 1, COMMUNICATION: 2, MEMORY: 3, OTHER: 0}


class KernelTotal(msgspec.Struct, frozen=True, gc=False):
    """One kernel name over the selected kernels: a row of a summary's ``top_kernels``.

    Attributes:
        name: the kernel's name.
        type: its class (:func:`kernel_type`).
        calls: how many times it ran.
        total_us: its total duration (not rounded); ``mean_us`` per call.
        pct: its share (%) of all selected kernel time.
    """

    name: str
    type: str
    calls: int
    total_us: float
    mean_us: float
    pct: float


class GpuBreakdown(msgspec.Struct, frozen=True):
    """A trace's GPU time with HTA's definitions: a summary's ``gpu``.

    Attributes:
        kernel_active_span_us: first kernel start to last kernel end (rounded as HTA rounds).
        busy_us: the union of all kernels; ``idle_us`` the span less it.
        compute_us: the union of computation kernels; ``non_compute_us`` the span less compute
            and idle; ``idle_pct``, ``compute_pct``, ``non_compute_pct``: the same in % of the span.
        communication_us: the union of communication kernels; ``comm_comp_overlap_us`` the part of
            it during which computation runs too (an exact ``0`` when none does), in %
            ``comm_comp_overlap_pct`` (None without communication).
        kernel_type_us: exclusive time per class (computation, communication, memory).
        kernel_type_overlapping_us: time per combination of classes running at once.
        kernels: the kernels counted; ``streams`` their CUDA streams.
        last_step_excluded: whether the last ProfilerStep's kernels were left out (HTA's rule).
    """

    kernel_active_span_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    communication_us: float
    comm_comp_overlap_us: int | float  # the JSON has always written "no overlap" as 0: kept as written
    comm_comp_overlap_pct: float | None
    kernel_type_us: dict[str, float]
    kernel_type_overlapping_us: dict[str, float]
    kernels: int
    streams: list[int]
    last_step_excluded: bool


class TemporalBreakdown(TypedDict):
    """HTA's temporal breakdown (part of :class:`GpuBreakdown`, which documents the keys)."""

    kernel_active_span_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float


class KernelTypeTimes(TypedDict):
    """Exclusive time per kernel class and per combination (part of :class:`GpuBreakdown`)."""

    kernel_type_us: dict[str, float]
    kernel_type_overlapping_us: dict[str, float]


@functools.lru_cache(maxsize=1 << 16)
def kernel_type(name: str) -> str:
    """HTA's ``get_kernel_type``: communication, memory, computation or other (memoised: a job's
    traces share their kernel names)."""
    if COMM_RE.match(name):
        return COMMUNICATION
    if MEMORY_RE.match(name):
        return MEMORY
    if not NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


def _name_types(trace: Trace) -> np.ndarray:
    """Kernel class of every distinct name (kept in ``trace.memo``)."""
    memo = trace.memo
    if memo.name_types is None:
        memo.name_types = np.array([kernel_type(n) for n in trace.names] or [OTHER], dtype=object)
    return memo.name_types


def _name_codes(trace: Trace) -> np.ndarray:
    """Kernel class of every name as a small integer (see ``_TYPE_CODES``)."""
    memo = trace.memo
    if memo.name_codes is None:
        memo.name_codes = np.array([_TYPE_CODES[str(t)] for t in _name_types(trace)], dtype=np.int8)
    return memo.name_codes


def hta_kernels(trace: Trace) -> tuple[np.ndarray, bool]:
    """Mask of the events HTA's analyses treat as kernels, and whether the last step was dropped."""
    valid = ~lookup(trace.cats, ("Trace",))[trace.cat_id]
    sync = lookup(trace.names, ("Event Sync", "Context Sync"))[trace.name_id]
    is_gpu = ((trace.stream >= 0) & (trace.corr >= 0)) | sync
    del sync
    is_step = lookup(trace.names, lambda n: "ProfilerStep" in n)
    has_stream = trace.stream != -1
    if int(is_step.sum()) < 2:
        return valid & has_stream, False
    cpu = valid & ~is_gpu
    kernels = valid & is_gpu
    del valid, is_gpu
    step_starts = trace.ts[cpu & is_step[trace.name_id]]
    if len(step_starts) == 0:
        return np.zeros(len(trace.ts), dtype=bool), True
    # HTA compares ceil(ts) < ceil(last step start); for an integer m, ceil(t) < m <=> t <= m - 1.
    kept_cpu = cpu & (trace.ts <= float(np.ceil(step_starts).max()) - 1.0)
    del cpu
    kept_corr = trace.corr[kept_cpu & (trace.corr >= 0)]  # most CPU events launch nothing
    kernels[kernels] = member(trace.corr[kernels], kept_corr)
    kernels |= kept_cpu
    return kernels & has_stream, True


def _kernel_intervals(trace: Trace, sel: np.ndarray) -> tuple[float, float, dict[str, Intervals]]:
    """Kernel-active span, busy time (union of all kernels) and the union of each class.

    The rounded per-kernel times live only in here, so they are freed before the sweeps.
    """
    ts = np.ceil(trace.ts[sel])
    end = np.floor(trace.ts[sel] + trace.dur[sel])
    codes = _name_codes(trace)[trace.name_id[sel]]
    starts, ends = merge_intervals(ts, end)
    span = float(ends[-1] - starts[0])
    busy = total((starts, ends))
    del starts, ends
    merged = {}
    for t in (COMPUTATION, COMMUNICATION, MEMORY):
        of_type = codes == _TYPE_CODES[t]
        merged[t] = merge_intervals(ts[of_type], end[of_type])
    return span, busy, merged


def temporal_breakdown(span: float, busy: float, computation: Intervals) -> TemporalBreakdown:
    """HTA's temporal breakdown: idle, compute and non-compute time, in us and % of the span."""
    idle = span - busy
    compute = total(computation)
    non_compute = span - compute - idle

    def pct(x: float) -> float:
        return 100.0 * x / span if span > 0 else 0.0

    return {
        "kernel_active_span_us": span,
        "busy_us": busy,
        "idle_us": idle,
        "compute_us": compute,
        "non_compute_us": non_compute,
        "idle_pct": pct(idle),
        "compute_pct": pct(compute),
        "non_compute_pct": pct(non_compute),
    }


def kernel_type_breakdown(merged: dict[str, Intervals],
                          exclusive: dict[int, float] | None = None) -> KernelTypeTimes:
    """Exclusive time per kernel class, and per combination of classes running at once
    (``exclusive``: :func:`time_per_combination` of the classes' bits, when already swept)."""
    if exclusive is None:
        exclusive = time_per_combination({bit: merged[t] for t, bit in _TYPE_BITS.items()})
    overlapping: dict[str, float] = {}
    for mask_value, time_us in sorted(exclusive.items()):
        parts = [t for t, bit in _TYPE_BITS.items() if mask_value & bit]
        if len(parts) > 1:
            overlapping[" overlapping ".join(parts)] = time_us
    return {
        "kernel_type_us": {t: exclusive.get(bit, 0.0) for t, bit in _TYPE_BITS.items()},
        "kernel_type_overlapping_us": overlapping,
    }


def top_kernels(trace: Trace, sel: np.ndarray, top: int | None) -> list[KernelTotal]:
    """The ``top`` kernel names (None: all) among events ``sel`` by total duration (not
    rounded), longest first."""
    name_id = trace.name_id[sel]
    dur = trace.dur[sel]
    totals = np.bincount(name_id, weights=dur, minlength=len(trace.names))
    count = np.bincount(name_id, minlength=len(trace.names))
    order = np.argsort(-totals, kind="stable")
    if top is not None:
        order = order[: max(top, 0)]
    types = _name_types(trace)
    grand = float(dur.sum()) or 1.0
    return [
        KernelTotal(name=trace.names[i], type=str(types[i]), calls=int(count[i]), total_us=float(totals[i]),
                    mean_us=float(totals[i] / count[i]), pct=100.0 * float(totals[i]) / grand)
        for i in order
        if count[i] > 0
    ]


def gpu_view(trace: Trace, top: int | None = 30) -> tuple[GpuBreakdown | None, list[KernelTotal]]:
    """A trace's GPU time with HTA's definitions, and its top kernels.

    Args:
        trace: the trace.
        top: kernel names to keep, longest total first (None: all).

    Returns:
        The breakdown (None when the trace has no kernels) and the top kernels.
    """
    mask, dropped_last = hta_kernels(trace)
    if not mask.any():
        return None, []
    sel = np.flatnonzero(mask)
    del mask
    span, busy, merged = _kernel_intervals(trace, sel)
    # One sweep serves the kernel-type breakdown and the overlap (comm and comp active: with or
    # without memory kernels).
    exclusive = time_per_combination({bit: merged[t] for t, bit in _TYPE_BITS.items()})
    both_bits = _TYPE_BITS[COMMUNICATION] | _TYPE_BITS[COMPUTATION]
    both = sum(t for mask, t in exclusive.items() if mask & both_bits == both_bits)
    gpu = GpuBreakdown(
        **temporal_breakdown(span, busy, merged[COMPUTATION]),
        **comm_comp_overlap(merged[COMMUNICATION], merged[COMPUTATION], both),
        **kernel_type_breakdown(merged, exclusive),
        kernels=len(sel),
        streams=sorted(int(x) for x in np.unique(trace.stream[sel])),
        last_step_excluded=dropped_last,
    )
    return gpu, top_kernels(trace, sel, top)
