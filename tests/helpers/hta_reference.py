"""Holistic Trace Analysis as the reference for trace figures, where HTA itself needs help.

HTA's ``get_temporal_breakdown`` asserts ``non_compute_time >= 0``; on traces with nanosecond
timestamps (torch 2.11's Kineto, e.g. ``gpu_1rank_h200_*`` in tests/data) its own rounding (start
times to whole microseconds, durations not) can make that sum a few microseconds negative, and the
assertion stops it.  :func:`temporal_breakdown` then recomputes the same figures with HTA's own
interval functions, without the assertion.
"""

from __future__ import annotations

from typing import Any


def temporal_breakdown(analysis: Any) -> dict[str, float]:
    """HTA's temporal breakdown of the first rank: ``idle_time_pctg``, ``compute_time_pctg``,
    ``non_compute_time_pctg`` (percent of the kernel-active span, rounded as HTA rounds)."""
    keys = ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg")
    try:
        row = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        return {key: float(row[key]) for key in keys}
    except AssertionError:
        pass
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.utils.utils import KernelType, get_kernel_type, merge_kernel_intervals

    symbols = analysis.t.symbol_table.get_sym_table()
    trace = analysis.t.traces[analysis.t.get_ranks()[0]]
    kernels = trace[trace["stream"].ne(-1)].copy()
    idle, span = BreakdownAnalysis._get_idle_time_for_kernels(kernels)
    kinds = kernels["name"].map(lambda name: get_kernel_type(symbols[name]))
    compute = merge_kernel_intervals(kernels[kinds.eq(KernelType.COMPUTATION.name)].copy())
    compute_time = compute.end.sum() - compute.ts.sum()
    non_compute = span - compute_time - idle
    return {
        "idle_time_pctg": round(100 * idle / span, 2),
        "compute_time_pctg": round(100 * compute_time / span, 2),
        "non_compute_time_pctg": round(100 * non_compute / span, 2),
    }
