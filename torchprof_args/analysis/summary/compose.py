"""``summarize``: one trace's summary, composed from the analyzers (what ``torchprof summary`` prints).

Each section comes from one analyzer in :mod:`torchprof_args.analysis.analyzers`; this module only
puts them together in the :class:`~.document.Summary` document, and cuts its top-N lists.
"""

from __future__ import annotations

import numpy as np
from msgspec.structs import replace

from torchprof_args.analysis.analyzers.compiled.regions import compiled_code
from torchprof_args.analysis.analyzers.cpu_ops import cpu_ops, cpu_view, top_ops
from torchprof_args.analysis.analyzers.fsdp import fsdp_phases, fsdp_step_split
from torchprof_args.analysis.analyzers.gpu import gpu_view
from torchprof_args.analysis.analyzers.memory_events import memory_view
from torchprof_args.analysis.analyzers.origin import device_name, origin
from torchprof_args.analysis.analyzers.step_ops import step_ops
from torchprof_args.analysis.analyzers.step_work import mean_work_us, trace_step_work
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.summary.document import StepTime, Summary
from torchprof_args.analysis.trace import Trace

__all__ = ["summarize", "truncate"]


def summarize(trace: Trace, top: int | None = 30) -> Summary:
    """Everything ``torchprof summary --json`` prints for one trace.

    Args:
        trace: a loaded trace (:func:`~torchprof_args.analysis.decode.loader.load_trace`).
        top: entries per top-N list (kernels, CPU operators by total / self / device time, the
            operators and kernels inside the steps); None keeps every entry (what a sidecar stores).

    Returns:
        The :class:`~.document.Summary`; ``jsonout.print_json`` prints it as ``--json`` does.
    """
    gpu, top_kernels = gpu_view(trace, top)
    ops = cpu_ops(trace)
    step_list = steps(trace)
    durs = [s["dur_us"] for s in step_list]
    info = trace.metadata.get("distributedInfo")
    backend = info.get("backend") if isinstance(info, dict) else None
    who = origin(trace)
    return Summary(
        file=str(trace.path),
        rank=trace.rank,
        world_size=trace.world_size,
        backend=backend if isinstance(backend, str) else None,
        host=who.host,
        iterations=who.iterations,
        parallel=who.parallel,
        base_time_ns=trace.base_time_ns,
        events=trace.n_events,
        uncompressed_bytes=trace.uncompressed_bytes,
        steps=[StepTime(s["name"], s["dur_us"]) for s in step_list],
        step_mean_us=float(np.mean(durs)) if durs else None,
        work_mean_us=mean_work_us(trace_step_work(trace)),
        gpu=gpu,
        cpu=cpu_view(trace),
        top_kernels=top_kernels,
        top_cpu_ops=top_ops(trace, ops, "cpu_total", top),
        top_cpu_ops_by_self=top_ops(trace, ops, "self_cpu", top),
        top_ops_by_device=top_ops(trace, ops, "device_total", top) if gpu is not None else [],
        memory=memory_view(trace),
        ops_in_steps=step_ops(trace, top),
        fsdp=fsdp_phases(trace),
        fsdp_step=fsdp_step_split(trace),
        compiled=compiled_code(trace, device_name(trace), top),
    )


def truncate(summary: Summary, top: int | None) -> Summary:
    """``summary`` with every top-N list cut to ``top`` entries.

    Args:
        summary: a summary computed with ``top=None`` (a sidecar's).
        top: entries to keep per list; None keeps them all.

    Returns:
        The cut summary (``summary`` itself when ``top`` is None).
    """
    if top is None:
        return summary
    top = max(top, 0)
    in_steps = summary.ops_in_steps
    compiled = summary.compiled
    if compiled is not None:
        compiled = replace(compiled, kernels=compiled.kernels[:top])
    return replace(
        summary, top_kernels=summary.top_kernels[:top], top_cpu_ops=summary.top_cpu_ops[:top],
        top_cpu_ops_by_self=summary.top_cpu_ops_by_self[:top],
        top_ops_by_device=summary.top_ops_by_device[:top],
        ops_in_steps=replace(in_steps, cpu=in_steps.cpu[:top], gpu=in_steps.gpu[:top]), compiled=compiled)
