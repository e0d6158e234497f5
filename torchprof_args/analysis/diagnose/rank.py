"""One rank's findings: every per-rank ``diagnose`` analyzer run over one :class:`Trace`.

Each kind's analyzer (``analysis/analyzers/<kind>.py``) returns a Finding, a Gap (the trace lacks
what it needs, and the flag that records it) or None (below its documented threshold); this
module runs them all.  It never raises on a trace that lacks something (no steps, no kernels, no
stacks, no FLOPs): those are Gaps.  Cross-rank kinds (``straggler``, ``collective_skew``) and
``pipeline_bubble`` are composed elsewhere, from many ranks.
"""

from __future__ import annotations

from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.diagnose.kinds import (
    dataloader_stall,
    exposed_comm,
    gpu_idle,
    host_sync,
    launch_bound,
    low_mfu,
    memcpy,
)
from torchprof_args.analysis.trace import Trace

__all__ = ["ANALYZERS", "rank_findings"]

#: the per-rank kinds, by the module that measures each.
ANALYZERS = {
    "gpu_idle": gpu_idle.analyze,
    "exposed_comm": exposed_comm.analyze,
    "launch_bound": launch_bound.analyze,
    "host_sync": host_sync.analyze,
    "dataloader_stall": dataloader_stall.analyze,
    "memcpy": memcpy.analyze,
    "low_mfu": low_mfu.analyze,
}


def rank_findings(trace: Trace, peak_tflops: float | None = None) -> list[Finding | Gap]:
    """Every per-rank finding and gap of ``trace``: findings by ``saving_ms_per_step``
    (largest first), then gaps.  ``peak_tflops`` overrides the device table for ``low_mfu``."""
    found: list[Finding] = []
    gaps: list[Gap] = []
    for kind, analyze in ANALYZERS.items():
        if kind == "low_mfu":  # last: its saving is what the others leave
            others = sum(f.saving_ms_per_step for f in found)
            result = analyze(trace, peak_tflops=peak_tflops, others_ms=others)
        else:
            result = analyze(trace)
        if isinstance(result, Finding):
            found.append(result)
        elif isinstance(result, Gap):
            gaps.append(result)
    found.sort(key=lambda f: -f.saving_ms_per_step)
    return [*found, *gaps]
