"""``summarize``: one trace's summary, composed from the analyzers (what ``torchprof summary`` prints).

Each part comes from one analyzer in :mod:`torchprof_args.analysis.analyzers`; this module only
puts them together in the summary's documented shape and key order (the ``--json`` output).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.cpu_ops import cpu_ops, cpu_view, top_ops
from torchprof_args.analysis.analyzers.gpu import gpu_view
from torchprof_args.analysis.analyzers.memory_events import memory_view
from torchprof_args.analysis.analyzers.origin import identity
from torchprof_args.analysis.analyzers.step_ops import step_ops
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.trace import Trace

__all__ = ["finite", "summarize"]


def summarize(trace: Trace, top: int | None = 30) -> dict[str, Any]:
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
        **identity(trace),
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


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers, for the encoder."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


_encode = msgspec.json.Encoder(enc_hook=_plain)
_decode = msgspec.json.Decoder()


def finite(value: Any) -> Any:
    """A copy of ``value`` with NaN/inf replaced by None, so the result is strict JSON.

    One JSON round trip in C (msgspec writes non-finite floats as null): a complete summary holds
    thousands of entries, and a Python walk over them cost more than parsing a small trace.
    Tuples come back as lists.
    """
    try:
        return _decode.decode(_encode.encode(value))
    except (TypeError, msgspec.EncodeError):
        return _finite_walk(value)


def _finite_walk(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_walk(v) for v in value]
    return value
