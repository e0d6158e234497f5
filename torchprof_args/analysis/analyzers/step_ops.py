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

from torchprof_args.analysis.analyzers.cpu_ops import cpu_ops, cpu_tree
from torchprof_args.analysis.analyzers.gpu import kernel_type
from torchprof_args.analysis.analyzers.select import lookup, member
from torchprof_args.analysis.analyzers.steps import STEP_RE, steps
from torchprof_args.analysis.trace import Trace

__all__ = ["step_ops"]

#: GPU-side events that are annotations, not work.
_GPU_ANNOTATION_CATS = ("gpu_user_annotation",)


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
    outside = _outside_steps(trace, starts, ends)
    cpu_calls, cpu_time = _cpu_in_steps(trace, outside)
    gpu_calls, gpu_time = _gpu_in_steps(trace, outside)
    name_cat = trace._cache.get("name_cat")
    return {
        "steps": len(spans),
        "cpu": _rows(trace, cpu_calls, cpu_time, top,
                     lambda i: {"cat": trace.cats[name_cat[i]] if name_cat is not None else ""}),
        "gpu": _rows(trace, gpu_calls, gpu_time, top, lambda i: {"type": kernel_type(trace.names[i])}),
    }


def _outside_steps(trace: Trace, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The CPU tree's events (indices into the trace) that start outside every step.

    Within a thread the tree has its events sorted by start, so each step is a range found by two
    binary searches; usually only a few events lie outside the steps.
    """
    tree = cpu_tree(trace)
    idx, bounds = tree["idx"], tree["bounds"]
    outside = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        ts = trace.ts[idx[lo:hi]]
        marks = np.zeros(len(ts) + 1, dtype=np.int32)
        np.add.at(marks, np.searchsorted(ts, starts, side="left"), 1)
        np.add.at(marks, np.searchsorted(ts, ends, side="left"), -1)
        inside = np.cumsum(marks[:-1]) > 0
        del ts, marks
        outside.append(idx[lo:hi][~inside])
    return np.concatenate(outside) if outside else np.zeros(0, dtype=np.int32)


def _cpu_in_steps(trace: Trace, outside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calls and time per name of the CPU events inside a step: every tree event's (from
    :func:`cpu_ops`) less those outside the steps; ``ProfilerStep#N`` themselves left out."""
    ops = cpu_ops(trace)
    size = len(trace.names)
    names = trace.name_id[outside]
    calls = ops["calls"] - np.bincount(names, minlength=size)
    time = ops["cpu_total"] - np.bincount(names, weights=trace.dur[outside], minlength=size)
    is_step = lookup(trace.names, STEP_RE.match)[:size]
    calls[is_step] = 0
    time[is_step] = 0.0
    return calls, np.maximum(time, 0.0)


def _gpu_in_steps(trace: Trace, outside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Calls and time per name of the GPU events launched from inside a step: those whose
    correlation id a CPU event launched, but not one outside the steps."""
    size = len(trace.names)
    on_gpu = (trace.stream >= 0) & (trace.corr >= 0)
    on_gpu &= ~lookup(trace.cats, _GPU_ANNOTATION_CATS)[trace.cat_id]
    idx = np.flatnonzero(on_gpu)
    del on_gpu
    if len(idx) == 0:
        return np.zeros(size, dtype=np.int64), np.zeros(size)
    tree_idx = cpu_tree(trace)["idx"]
    launched = trace.corr[tree_idx]
    launched = launched[launched >= 0]
    corr = trace.corr[idx]
    keep = member(corr, launched)
    del launched
    late = trace.corr[outside]
    late = late[late >= 0]
    if len(late):
        keep &= ~member(corr, late)
    idx = idx[keep]
    names = trace.name_id[idx]
    return np.bincount(names, minlength=size), np.bincount(names, weights=trace.dur[idx], minlength=size)


def _rows(trace: Trace, calls: np.ndarray, time: np.ndarray, top: int | None, extra: Any) -> list[dict[str, Any]]:
    present = np.flatnonzero(calls)
    present = present[np.argsort(-time[present], kind="stable")]
    if top is not None:
        present = present[: max(top, 0)]
    return [{"name": trace.names[i], **extra(i), "calls": int(calls[i]), "total_us": float(time[i])} for i in present]
