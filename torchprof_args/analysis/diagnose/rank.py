"""One rank's part of the diagnosis: every per-rank kind of the registry run over one :class:`Trace`.

:func:`rank_findings` runs the registry's per-rank kinds in order, each told the findings before it
(:class:`~.context.KindContext`).  :func:`rank_diagnosis` is the :class:`~.documents.RankDiagnosis`
the publisher keeps in the trace's summary sidecar: the kinds but ``low_mfu``, what the cross-rank
kinds need (each step's work and collective time, the collective records) and ``low_mfu``'s inputs,
judged once, by :func:`~.job_findings.diagnose`, against the peak the reader asks for.  Neither
raises on a trace that lacks something (no steps, no kernels, no stacks, no FLOPs): those are Gaps.
"""

from __future__ import annotations

import statistics

from torchprof_args.analysis.analyzers.collectives import rank_collectives
from torchprof_args.analysis.analyzers.origin import origin
from torchprof_args.analysis.analyzers.step_work import trace_step_work
from torchprof_args.analysis.diagnose.context import KindContext, Peak
from torchprof_args.analysis.diagnose.documents import CompactRecords, RankDiagnosis
from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.diagnose.kinds import low_mfu
from torchprof_args.analysis.diagnose.registry import PER_RANK, PerRankKind
from torchprof_args.analysis.trace import Trace
from torchprof_args.shared import formats

__all__ = ["rank_diagnosis", "rank_findings"]


def rank_findings(trace: Trace, peak_tflops: float | None = None, dtype: str = "bf16") -> list[Finding | Gap]:
    """Every per-rank finding and gap of one trace.

    Args:
        trace: one rank's trace (``comms=True``: exposed communication by process group;
            ``flops=True``: ``low_mfu``).
        peak_tflops: the GPU's dense peak for ``low_mfu`` (default: the device table's).
        dtype: which of the table's peaks ``low_mfu`` compares with.

    Returns:
        The findings by ``saving_ms_per_step`` (largest first), then the gaps in the registry's order.
    """
    found, gaps = _run(trace, PER_RANK, KindContext(peak=Peak(peak_tflops, dtype)))
    return [*found, *gaps]


def _run(trace: Trace, kinds: tuple[PerRankKind, ...],
         kind_ctx: KindContext) -> tuple[list[Finding], list[Gap]]:
    """``kinds`` over ``trace`` in order, each told the findings before it: (findings by saving, gaps)."""
    found: list[Finding] = []
    gaps: list[Gap] = []
    for kind in kinds:
        result = kind.analyze(trace, kind_ctx.after(found))
        if isinstance(result, Finding):
            found.append(result)
        elif isinstance(result, Gap):
            gaps.append(result)
    found.sort(key=lambda f: -f.saving_ms_per_step)
    return found, gaps


def rank_diagnosis(trace: Trace) -> RankDiagnosis:
    """One rank's part of the diagnosis (what the summary sidecar keeps).

    Args:
        trace: one rank's trace, loaded with ``comms=True`` and ``flops=True``.  Without its
            communication events the rank has no collective records (no ``collective_skew``, and
            ``straggler`` counts the whole step as work); without FLOPs, ``low_mfu`` is a gap.

    Returns:
        The rank's :class:`RankDiagnosis`: ``low_mfu`` as its inputs (or the gap that says why there
        are none), not judged.
    """
    found, gaps = _run(trace, tuple(k for k in PER_RANK if k.KIND != low_mfu.KIND), KindContext())
    mfu = low_mfu.mfu_inputs(trace)
    comms = rank_collectives(trace) if trace.comms is not None else None
    records = comms.records if comms is not None else []
    base_us = trace.base_time_ns / 1000.0
    work = trace_step_work(trace)
    return RankDiagnosis(
        format=formats.DIAGNOSIS.version, rank=trace.rank, world_size=trace.world_size, base_us=base_us,
        steps=work,
        step_mean_us=statistics.fmean(s.dur_us for s in work) if work else None,
        findings=found, gaps=[*gaps, mfu] if isinstance(mfu, Gap) else gaps,
        comm_source=comms.source if comms is not None else None,
        pg_config=comms.pg_config if comms is not None else [],
        collectives=CompactRecords.of(records), host=origin(trace).host,
        mfu_inputs=None if isinstance(mfu, Gap) else mfu,
    )
