"""``pipeline_bubble``: a pipeline stage's idle time inside the step, against the schedule's bubble.

For one rank (one pipeline stage) and each ``ProfilerStep``: the time between the step's first
and last compute during which the stage computes nothing, because it waits for activations from
the previous stage or gradients from the next.

* GPU traces: the gaps between computation kernels (HTA's kernel classes,
  :mod:`torchprof_args.analysis.analyzers.gpu`) from the step's first computation kernel to its last
  (kernels starting in the step's span, up to the next step's start);
* CPU traces (no kernels; a CPU thread never idles, it *waits*): the time the step's thread spends
  in blocking communication (``gloo:recv``, ``c10d::`` / ``nccl:`` / ``gloo:`` operations, ``wait``)
  between its first and last ``aten::`` operator.

The theoretical bubble of a 1F1B / GPipe schedule is (p - 1) / (m + p - 1) of the step for ``p``
stages and ``m`` micro-batches; both come from the trace's ``torchprof_args.pipeline`` metadata
(recorded for DeepSpeed pipeline engines and Megatron-LM runs, or by ``add_trace_metadata``).
Without it the rank is not known to be a pipeline stage and nothing is reported.  Below
:data:`THRESHOLD` nothing is reported either.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.gpu import COMPUTATION, kernel_type
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.steps import STEP_RE, steps
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
from torchprof_args.analysis.intervals import merge_intervals, total
from torchprof_args.analysis.trace import StepSpan, Trace

__all__ = ["KIND", "SCOPE", "THRESHOLD", "analyze", "pipeline_schedule", "theoretical_bubble"]

KIND = "pipeline_bubble"
SCOPE = Scope.PER_RANK
#: the stage's idle time between its first and last compute must reach 2 % of the step and 0.5 ms.
THRESHOLD = Threshold(share_of_step=0.02, min_ms=0.5)
#: blocking communication on a CPU thread: where a CPU pipeline stage waits for its neighbours.
_WAIT_RE = re.compile(r"^(gloo|nccl|xccl):|^c10d::|^record_param_comms$|wait", re.IGNORECASE)


def pipeline_schedule(trace: Trace) -> tuple[int, int, int | None] | None:
    """(stages, micro-batches, this rank's stage) from the trace's metadata, None when unknown."""
    meta = trace.metadata.get("torchprof_args")
    pipe = meta.get("pipeline") if isinstance(meta, dict) else None
    if not isinstance(pipe, dict):
        return None
    p, m = pipe.get("stages"), pipe.get("micro_batches")
    if not (isinstance(p, int) and isinstance(m, int) and p >= 2 and m >= 1):
        return None
    stage = pipe.get("stage")
    return p, m, stage if isinstance(stage, int) else None


def theoretical_bubble(stages: int, micro_batches: int) -> float:
    """The schedule's bubble as a share of the step: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def _gpu_idle(trace: Trace, lo: float, hi: float) -> tuple[float, float | None]:
    """Idle time between the first and last computation kernel starting in [lo, hi); start of the
    longest gap."""
    kind = lookup(trace.names, lambda n: kernel_type(n) == COMPUTATION)
    sel = np.flatnonzero((trace.stream >= 0) & kind[trace.name_id] & (trace.ts >= lo) & (trace.ts < hi))
    if len(sel) < 2:
        return 0.0, None
    starts, ends = merge_intervals(trace.ts[sel], trace.ts[sel] + trace.dur[sel])
    gaps = starts[1:] - ends[:-1]
    idle = float(gaps.sum())
    return idle, (float(ends[int(np.argmax(gaps))]) if len(gaps) else None)


def _cpu_waits(trace: Trace, thread: int, lo: float, hi: float) -> tuple[float, float | None]:
    """Blocking communication on ``thread`` between its first and last aten operator in [lo, hi)."""
    on_thread = (trace.thread_id == thread) & (trace.stream == -1) & (trace.ts >= lo) & (trace.ts < hi)
    aten = np.flatnonzero(on_thread & lookup(trace.names, lambda n: n.startswith("aten::"))[trace.name_id])
    if len(aten) < 2:
        return 0.0, None
    first, last = float(trace.ts[aten].min()), float((trace.ts[aten] + trace.dur[aten]).max())
    waits = np.flatnonzero(on_thread & lookup(trace.names, _WAIT_RE.search)[trace.name_id])
    if len(waits) == 0:
        return 0.0, None
    s = np.maximum(trace.ts[waits], first)
    e = np.minimum(trace.ts[waits] + trace.dur[waits], last)
    keep = e > s
    if not keep.any():
        return 0.0, None
    starts, ends = merge_intervals(s[keep], e[keep])
    longest = int(np.argmax(ends - starts))
    return total((starts, ends)), float(starts[longest])


def _step_threads(trace: Trace) -> dict[str, int]:
    """The thread each ProfilerStep annotation runs on."""
    is_step = lookup(trace.names, STEP_RE.match)
    idx = np.flatnonzero(is_step[trace.name_id] & (trace.stream == -1))
    return {trace.names[trace.name_id[i]]: int(trace.thread_id[i]) for i in idx}


def _per_step(trace: Trace, spans: list[StepSpan]) -> list[dict[str, Any]]:
    gpu = bool((trace.stream >= 0).any())
    threads = _step_threads(trace) if not gpu else {}
    out = []
    for i, step in enumerate(spans):
        lo = step["start_us"]
        hi = spans[i + 1]["start_us"] if gpu and i + 1 < len(spans) else lo + step["dur_us"]
        if gpu:
            idle, at = _gpu_idle(trace, lo, hi)
        else:
            idle, at = _cpu_waits(trace, threads.get(step["name"], -1), lo, hi)
        out.append({"name": step["name"], "dur_us": step["dur_us"], "idle_us": idle, "at_us": at})
    return out


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """This stage's pipeline bubble (see the module).

    Args:
        trace: one rank's trace, with the schedule in its ``torchprof_args.pipeline`` metadata.
        kind_ctx: the kind's context (thresholds).

    Returns:
        The finding; None when the rank is not a known pipeline stage, has no steps, or its idle
        time is below :data:`THRESHOLD`.
    """
    schedule = pipeline_schedule(trace)
    spans = steps(trace)
    if schedule is None or not spans:
        return None
    p, m, stage = schedule
    rows = _per_step(trace, spans)
    idle_ms = float(np.mean([r["idle_us"] for r in rows])) / 1e3
    step_ms = float(np.mean([r["dur_us"] for r in rows])) / 1e3
    share = idle_ms / step_ms if step_ms else 0.0
    if not kind_ctx.threshold(THRESHOLD).reached(idle_ms, share if step_ms else None):
        return None
    theory = theoretical_bubble(p, m)
    worst = max(rows, key=lambda r: r["idle_us"])
    rank = trace.rank
    where = f"stage {stage}" if stage is not None else f"rank {rank}"
    how = "computes nothing (no computation kernel)" if (trace.stream >= 0).any() else \
        "waits in blocking communication"
    return Finding(
        kind=KIND,
        summary=(f"Pipeline {where} of {p} {how} for {idle_ms:.1f} ms per step between its first and last "
                 f"compute ({100 * share:.0f} % of the step; the schedule's bubble with {m} micro-batches is "
                 f"{100 * theory:.0f} %)."),
        ranks=(rank,) if rank is not None else (),
        ms_per_step=idle_ms, share_of_step=share, saving_ms_per_step=idle_ms,
        saving_bound=("all of the stage's idle time; the schedule's own bubble (p-1)/(m+p-1) goes only with "
                      "more micro-batches or an interleaved / zero-bubble schedule"),
        remedy=(f"More micro-batches per step (m={m}: bubble {100 * theory:.0f} %, m={2 * m}: "
                f"{100 * theoretical_bubble(p, 2 * m):.0f} %), an interleaved schedule (Megatron "
                "--num-layers-per-virtual-pipeline-stage), or balance the stages' layers."),
        evidence={
            "stages": p, "micro_batches": m, "stage": stage,
            "theoretical_bubble_share": round(theory, 4), "measured_share": round(share, 4),
            "excess_over_schedule_ms": round(max(idle_ms - theory * step_ms, 0.0), 3),
            "per_step_ms": {r["name"]: round(r["idle_us"] / 1e3, 3) for r in rows},
            "perfetto_ts_us": worst["at_us"],
        },
    )
