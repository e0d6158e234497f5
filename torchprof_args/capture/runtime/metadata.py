"""The run's settings stored in each trace, under the ``torchprof_args`` metadata key."""

from __future__ import annotations

import sys
from typing import Any

from torchprof_args.capture.runtime.config import TraceConfig
from torchprof_args.capture.runtime.timeline import Timeline
from torchprof_args.naming import short_hostname

__all__ = ["megatron_coordinates", "pipeline_metadata", "trace_metadata"]


def megatron_coordinates() -> dict[str, int] | None:
    """This rank's (dp, tp, pp, cp, ep) when the job runs megatron-core with its parallel state up;
    None otherwise.  Never imports megatron (the window may be recording: an import would fill the
    trace with its frames)."""
    ps = sys.modules.get("megatron.core.parallel_state")
    try:
        if ps is None or not ps.model_parallel_is_initialized():
            return None
        return {"dp": ps.get_data_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
                "pp": ps.get_pipeline_model_parallel_rank(), "cp": ps.get_context_parallel_rank(),
                "ep": ps.get_expert_model_parallel_rank()}
    except Exception:  # noqa: BLE001 - an older megatron-core without one of them: no coordinates
        return None


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
    coordinates = megatron_coordinates()
    if coordinates is not None:  # `torchprof mem` names outlier ranks by them
        metadata["parallel"] = coordinates
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
