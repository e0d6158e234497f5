"""Python call sites of CPU events: the innermost user frame (``python_function`` events, recorded
with ``--torch-profile-with-stack``) enclosing an event on its thread; in a kernel inductor
generated, the module it came from (``--torch-profile-compiled-modules``' map,
:mod:`.kernel_modules`) instead of the frame of inductor's generated code."""

from __future__ import annotations

import re

import numpy as np

from torchprof_args.analysis.analyzers.compiled.kernel_modules import kernel_module_match, kernel_name
from torchprof_args.analysis.analyzers.nesting import enclosing
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
    its innermost frame of any kind, else None (no frame on its thread encloses it); an event in a
    generated kernel matched to the compiled-modules map: ``layers.0.attn (cpp_fused_relu_2)``.

    A thread's frames nest, so the frames around an event are one chain of ancestors: each event
    climbs it from the innermost frame around its start (:func:`~.nesting.enclosing`, a Nesting per
    thread), a few steps, never a search of every frame."""
    idx = np.asarray(idx, dtype=np.int64)
    out: list[str | None] = [None] * len(idx)
    frames = _python_events(trace)
    if len(frames) == 0 or len(idx) == 0:
        return out
    user_name = lookup(trace.names, lambda n: bool(FRAME_RE.search(n)) and not LIBRARY_RE.search(n))
    for q, found in enumerate(enclosing(trace, idx, frames, preferred=user_name).tolist()):
        if found >= 0:
            out[q] = trace.names[trace.name_id[found]]
    match = kernel_module_match(trace)
    if len(match.idx):
        module_of = dict(zip(match.idx.tolist(), match.module, strict=True))
        for q, found in enumerate(enclosing(trace, idx, match.idx).tolist()):
            if found >= 0:
                out[q] = f"{module_of[found]} ({kernel_name(trace.names[trace.name_id[found]])})"
    return out
