"""Training steps: the ``ProfilerStep#N`` annotations ``torch.profiler`` records on the CPU."""

from __future__ import annotations

import re

import numpy as np

from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.trace import StepSpan, Trace

__all__ = ["STEP_RE", "steps"]

STEP_RE = re.compile(r"^ProfilerStep#\d+$")


def steps(trace: Trace) -> list[StepSpan]:
    """ProfilerStep#N annotations on the CPU, in time order (first occurrence of each name).

    Only CPU events count (no CUDA stream): GPU-side copies of the annotation would count a step
    twice.  Kept in ``trace.memo`` (callers get copies).
    """
    if trace.memo.steps is not None:
        return [StepSpan(**s) for s in trace.memo.steps]
    is_step = lookup(trace.names, STEP_RE.match)
    idx = np.flatnonzero(is_step[trace.name_id])
    idx = idx[trace.stream[idx] == -1]
    idx = idx[np.argsort(trace.ts[idx], kind="stable")]
    out: list[StepSpan] = []
    seen = set()
    for i in idx:
        name = trace.names[trace.name_id[i]]
        if name in seen:
            continue
        seen.add(name)
        out.append({"name": name, "start_us": float(trace.ts[i]), "dur_us": float(trace.dur[i])})
    trace.memo.steps = out
    return [StepSpan(**s) for s in out]
