"""Python call sites of CPU events: the innermost user frame (``python_function`` events, recorded
with ``--torch-profile-with-stack``) enclosing an event on its thread."""

from __future__ import annotations

import re

import numpy as np

from torchprof_args.analysis.analyzers.nesting import Nesting
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.trace import Trace

__all__ = ["STACK_FLAG", "call_sites", "has_stacks"]

STACK_FLAG = "--torch-profile-with-stack"
FRAME_RE = re.compile(r"\.py\(\d+\): ")
#: frames of the framework, not the user's code.
LIBRARY_RE = re.compile(r"site-packages|dist-packages|(^|/)torch/|^<built-in|^<frozen")


def _python_events(trace: Trace) -> np.ndarray:
    return np.flatnonzero(lookup(trace.cats, ("python_function",))[trace.cat_id])


def has_stacks(trace: Trace) -> bool:
    """Whether the trace holds Python frames."""
    return bool(lookup(trace.cats, ("python_function",))[:-1].any())


def call_sites(trace: Trace, idx: np.ndarray) -> list[str | None]:
    """Per event of ``idx``, its innermost enclosing user frame (``file.py(line): function``), else
    its innermost frame of any kind, else None (no frame on its thread encloses it).

    A thread's frames nest, so the frames around an event are one chain of ancestors: each event
    climbs it from the innermost frame around its start (:class:`~.nesting.Nesting`, built once per
    thread), a few steps, never a search of every frame."""
    idx = np.asarray(idx, dtype=np.int64)
    out: list[str | None] = [None] * len(idx)
    frames = _python_events(trace)
    if len(frames) == 0 or len(idx) == 0:
        return out
    names = trace.names
    user_name = lookup(names, lambda n: bool(FRAME_RE.search(n)) and not LIBRARY_RE.search(n))
    f_thread = trace.thread_id[frames]
    q_thread = trace.thread_id[idx]
    for thread in np.unique(q_thread).tolist():
        mine = frames[f_thread == thread]
        if not len(mine):
            continue
        f_end = trace.ts[mine] + trace.dur[mine]
        nest = Nesting(trace.ts[mine], f_end)
        asked = np.flatnonzero(q_thread == thread)
        ends = (trace.ts[idx[asked]] + trace.dur[idx[asked]]).tolist()
        for q, found, end in zip(asked.tolist(), nest.innermost(trace.ts[idx[asked]]).tolist(), ends,
                                 strict=True):
            if found < 0:
                continue
            around = [f for f in nest.chain(found) if f_end[f] >= end]  # innermost first
            if not around:
                continue
            best = next((f for f in around if user_name[trace.name_id[mine[f]]]), around[0])
            out[q] = names[trace.name_id[mine[best]]]
    return out
