"""The run's settings stored in each trace, under the ``torchprof_args`` metadata key."""

from __future__ import annotations

from typing import Any

from torchprof_args.naming import short_hostname
from torchprof_args.runtime.config import TraceConfig
from torchprof_args.runtime.timeline import Timeline

__all__ = ["pipeline_metadata", "trace_metadata"]


def trace_metadata(trace: TraceConfig, timeline: Timeline, first: int, *,
                   traced_ranks: tuple[int, ...] | None, rank: int, world_size: int) -> dict[str, Any]:
    """Settings, rank and window of the trace whose window starts recording at ``first`` (Kineto
    takes metadata only while recording, so this is added when the window opens)."""
    metadata = {
        "schedule": timeline.schedule.describe() if timeline.scheduled else "on demand only",
        "ranks": (["all"] if traced_ranks is None else list(traced_ranks)) if trace.enabled else [],
        "activities": list(trace.activities) or "auto",
        **trace.profiler_options(), "execution_trace": trace.execution_trace,
        **({"module_hierarchy": "with_stack (asked by --torch-profile-with-modules)"}
           if trace.modules_via_stack else {}),
        "rank": rank, "world_size": world_size, "host": short_hostname(),
        "iterations": [first, timeline.window_last(first)],
    }
    window = timeline.window
    if window is not None and window.start <= first < window.end:
        metadata["on_demand_request"] = window.request_id
    return metadata


def pipeline_metadata(stages: int, micro_batches: int, stage: int | None = None) -> dict[str, int]:
    """The pipeline schedule a trace's ``pipeline`` metadata records: stages ``p``, micro-batches ``m``
    per step and this rank's stage (``torchprof diagnose`` compares each stage's idle time with the
    schedule's bubble, (p - 1) / (m + p - 1))."""
    doc = {"stages": int(stages), "micro_batches": int(micro_batches)}
    if stage is not None:
        doc["stage"] = int(stage)
    return doc
