"""Operators and kernels inside the profiled steps, per name: what ``torchprof diff`` compares.

The rules are Holistic Trace Analysis' ``TraceDiff`` (``hta.trace_diff``), so a diff can be
checked against it:

* a CPU event belongs to step ``ProfilerStep#N`` when it starts inside that annotation's span
  (``start <= ts < start + dur``); events outside every step are not counted;
* a GPU event (kernel, memcpy, memset: an event with a CUDA stream) belongs to the step of the
  runtime call that launched it (same correlation id);
* events are grouped by name: number of calls and total duration.

CPU events are the operator tree's (``cpu_op``, ``user_annotation``, ``cuda_runtime``,
``cuda_driver``; Python stack frames are left out), without the ``ProfilerStep#N`` annotations
themselves (their names differ from step to step).  Totals are over all steps; the step count
comes with them, so two traces with different numbers of steps compare per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.cpu_ops import cpu_tree
from torchprof_args.analysis.analyzers.gpu import kernel_type
from torchprof_args.analysis.analyzers.select import lookup, member
from torchprof_args.analysis.analyzers.steps import STEP_RE, steps
from torchprof_args.analysis.trace import Trace

__all__ = ["step_ops"]

#: GPU-side events that are annotations, not work.
_GPU_ANNOTATION_CATS = ("gpu_user_annotation",)
#: CPU events handled per piece (bounds the temporaries on multi-GB traces).
_PIECE = 1 << 18


def step_ops(trace: Trace, top: int | None = None) -> dict[str, Any]:
    """``{"steps": N, "cpu": [...], "gpu": [...]}``: per name, calls and total time inside the steps.

    Rows are ``{"name", "cat", "calls", "total_us"}`` (CPU) and ``{"name", "type", "calls",
    "total_us"}`` (GPU, ``type`` as in the kernel breakdown), longest total first, at most
    ``top`` of each (None: all).
    """
    spans = steps(trace)
    if not spans:
        return {"steps": 0, "cpu": [], "gpu": []}
    starts = np.array([s["start_us"] for s in spans])
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    ends = starts + np.array([s["dur_us"] for s in spans])[order]
    cpu_calls, cpu_time, cat_of, launched = _cpu_in_steps(trace, starts, ends)
    gpu_calls, gpu_time = _gpu_in_steps(trace, launched)
    return {
        "steps": len(spans),
        "cpu": _rows(trace, cpu_calls, cpu_time, top, lambda i: {"cat": trace.cats[cat_of[i]]}),
        "gpu": _rows(trace, gpu_calls, gpu_time, top, lambda i: {"type": kernel_type(trace.names[i])}),
    }


def _cpu_in_steps(trace: Trace, starts: np.ndarray,
                  ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Calls, time and category per name of the CPU events inside a step; the correlation ids
    they launched."""
    idx = cpu_tree(trace)["idx"]
    not_step = ~lookup(trace.names, STEP_RE.match)
    size = len(trace.names)
    calls = np.zeros(size, dtype=np.int64)
    time = np.zeros(size)
    cat_of = np.zeros(size, dtype=np.int32)
    launched = []
    for lo in range(0, len(idx), _PIECE):
        piece = idx[lo : lo + _PIECE]
        ts = trace.ts[piece]
        j = np.searchsorted(starts, ts, side="right") - 1
        inside = j >= 0
        inside[inside] = ts[inside] < ends[j[inside]]
        del ts, j
        piece = piece[inside]
        names = trace.name_id[piece]
        keep = not_step[names]
        piece, names = piece[keep], names[keep]
        calls += np.bincount(names, minlength=size)
        time += np.bincount(names, weights=trace.dur[piece], minlength=size)
        cat_of[names] = trace.cat_id[piece]
        corr = trace.corr[piece]
        launched.append(corr[corr >= 0])
    return calls, time, cat_of, np.concatenate(launched) if launched else np.zeros(0, dtype=np.int64)


def _gpu_in_steps(trace: Trace, launched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calls and time per name of the GPU events launched from inside a step."""
    size = len(trace.names)
    on_gpu = (trace.stream >= 0) & (trace.corr >= 0)
    on_gpu &= ~lookup(trace.cats, _GPU_ANNOTATION_CATS)[trace.cat_id]
    idx = np.flatnonzero(on_gpu)
    del on_gpu
    idx = idx[member(trace.corr[idx], launched)]
    names = trace.name_id[idx]
    return np.bincount(names, minlength=size), np.bincount(names, weights=trace.dur[idx], minlength=size)


def _rows(trace: Trace, calls: np.ndarray, time: np.ndarray, top: int | None, extra: Any) -> list[dict[str, Any]]:
    present = np.flatnonzero(calls)
    present = present[np.argsort(-time[present], kind="stable")]
    if top is not None:
        present = present[: max(top, 0)]
    return [{"name": trace.names[i], **extra(i), "calls": int(calls[i]), "total_us": float(time[i])} for i in present]
