"""Python call sites of CPU events: the innermost user frame (``python_function`` events, recorded
with ``--torch-profile-with-stack``) enclosing an event on its thread."""

from __future__ import annotations

import re

import numpy as np

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
    its innermost frame of any kind, else None (no frame on its thread encloses it)."""
    frames = _python_events(trace)
    if len(frames) == 0:
        return [None] * len(idx)
    f_ts, f_end, f_thread = trace.ts[frames], trace.ts[frames] + trace.dur[frames], trace.thread_id[frames]
    names = trace.names
    user_name = lookup(names, lambda n: bool(FRAME_RE.search(n)) and not LIBRARY_RE.search(n))
    is_user = user_name[trace.name_id[frames]]
    out: list[str | None] = []
    for i in idx:
        inside = f_thread == trace.thread_id[i]
        inside &= (f_ts <= trace.ts[i]) & (f_end >= trace.ts[i] + trace.dur[i])
        if not inside.any():
            out.append(None)
            continue
        pick = inside & is_user if (inside & is_user).any() else inside
        best = np.flatnonzero(pick)[np.argmax(f_ts[pick])]
        out.append(names[trace.name_id[frames[best]]])
    return out
