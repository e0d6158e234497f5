"""``summarize``: one trace's summary, composed from the analyzers (what ``torchprof summary`` prints).

Each part comes from one analyzer in :mod:`torchprof_args.analysis.analyzers`; this module only
puts them together in the summary's documented shape and key order (the ``--json`` output).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.cpu_ops import cpu_ops, cpu_view, top_ops
from torchprof_args.analysis.analyzers.gpu import gpu_view
from torchprof_args.analysis.analyzers.memory_events import memory_view
from torchprof_args.analysis.analyzers.origin import origin
from torchprof_args.analysis.analyzers.step_ops import step_ops
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.trace import Trace

__all__ = ["Summary", "summarize", "truncate"]

#: one trace's summary (a dict for now: its keys are documented by ``torchprof summary --json``).
Summary = dict[str, Any]
#: the summary's lists that ``top`` bounds.
_TOP_LISTS = ("top_kernels", "top_cpu_ops", "top_cpu_ops_by_self", "top_ops_by_device")


def summarize(trace: Trace, top: int | None = 30) -> Summary:
    """Everything ``torchprof summary --json`` prints for one trace (JSON-serialisable dict).

    ``top`` bounds the top-N lists (kernels, CPU operators by total / self / device time, the
    operators and kernels inside the steps); None keeps every entry (what a sidecar stores).
    """
    gpu, top_kernels = gpu_view(trace, top)
    ops = cpu_ops(trace)
    step_list = steps(trace)
    durs = [s["dur_us"] for s in step_list]
    return {
        "file": str(trace.path),
        "rank": trace.rank,
        "world_size": trace.world_size,
        "backend": (trace.metadata.get("distributedInfo") or {}).get("backend"),
        **origin(trace),
        "base_time_ns": trace.base_time_ns,
        "events": trace.n_events,
        "uncompressed_bytes": trace.uncompressed_bytes,
        "steps": [{"name": s["name"], "dur_us": s["dur_us"]} for s in step_list],
        "step_mean_us": float(np.mean(durs)) if durs else None,
        "gpu": gpu,
        "cpu": cpu_view(trace),
        "top_kernels": top_kernels,
        "top_cpu_ops": top_ops(trace, ops, "cpu_total", top),
        "top_cpu_ops_by_self": top_ops(trace, ops, "self_cpu", top),
        "top_ops_by_device": top_ops(trace, ops, "device_total", top) if gpu is not None else [],
        "memory": memory_view(trace),
        "ops_in_steps": step_ops(trace, top),
    }


def truncate(summary: Summary, top: int | None) -> Summary:
    """``summary`` (complete lists) with every top-N list cut to ``top`` entries (in place).

    Args:
        summary: a summary computed with ``top=None`` (a sidecar's).
        top: entries to keep per list; None keeps them all.

    Returns:
        ``summary`` itself.
    """
    if top is None:
        return summary
    top = max(top, 0)
    for key in _TOP_LISTS:
        if isinstance(summary.get(key), list):
            summary[key] = summary[key][:top]
    steps = summary.get("ops_in_steps")
    if isinstance(steps, dict):
        for key in ("cpu", "gpu"):
            if isinstance(steps.get(key), list):
                steps[key] = steps[key][:top]
    return summary
