"""The diagnosis documents: a rank's part (kept in its summary sidecar) and the job's (``--json``).

Two stages, so that 512 ranks need no trace parsed: :class:`RankDiagnosis` is computed once per
rank, when its trace is published (:func:`~.rank.rank_diagnosis`), and stored in the trace's
sidecar under ``diagnosis``; :class:`JobDiagnosis` is one cycle's diagnosis from its ranks' parts
(:func:`~.job_findings.diagnose`), the schema of ``torchprof diagnose --json`` (docs/guides/diagnose.md).
Both are msgspec structs whose fields are in the documents' key order, so they encode to the
documented JSON as they are.
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment
from torchprof_args.analysis.analyzers.collectives import CompactRecords, RankComms, absolute_steps
from torchprof_args.analysis.analyzers.compiled.regions import KernelRoofline
from torchprof_args.analysis.analyzers.step_work import StepWork
from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.trace import StepSpan

__all__ = [
 "CompactRecords", "JobDiagnosis", "JobGap", "MfuInputs",
    "RankDiagnosis",
]


class MfuInputs(msgspec.Struct, frozen=True):
    """What ``low_mfu`` needs from one rank's trace, kept so that ``diagnose`` judges it once, against
    the table's peak or the one ``--peak-tflops`` / ``--peak-dtype`` give, without the trace."""

    rank: int
    flops_per_step: float
    step_ms: float
    device: str | None
    #: the step evidence every finding carries, with the longest step's ``perfetto_ts_us``.
    step_evidence: dict[str, Any]
    #: the GPU's computation kernel time per step (ms), and the part launched by an operator with a
    #: FLOP count (what the FLOPs account for).
    compute_ms: float | None = None
    accounted_ms: float | None = None
    #: of ``flops_per_step``, what inductor wrote into its Triton kernels' launches (``kernel_flop``).
    inductor_flops_per_step: float = 0.0
    #: the compute time per step (ms) in Triton kernels inductor wrote no FLOP count for (compiled
    #: without ``--torch-profile-with-flops``).
    uncounted_triton_ms: float = 0.0
    #: the Triton kernels with the most device time, on the roofline (inductor's estimates).
    kernels: list[KernelRoofline] = msgspec.field(default_factory=list)


class RankDiagnosis(msgspec.Struct, frozen=True):
    """One rank's part of the diagnosis (the sidecar's ``diagnosis``).

    Attributes:
        format: ``formats.DIAGNOSIS.version``.
        rank: the trace's rank (None: the trace does not say; the file name may).
        world_size: the trace's world size, when it says.
        base_us: the trace's base time (``baseTimeNanoseconds``) in us.
        steps: each step's time, collective time and work (``straggler``).
        step_mean_us: the mean step; None without steps.
        findings: the per-rank kinds' findings, largest saving first (``low_mfu``'s is judged by
            ``diagnose`` from ``mfu_inputs``).
        gaps: the per-rank kinds' gaps, in the registry's order.
        comm_source: where the collective records come from (None: not decoded).
        pg_config: the process groups the trace describes.
        collectives: the collective records (``collective_skew``, ``straggler``).
        mfu_inputs: ``low_mfu``'s inputs; None when the trace cannot give them (a gap says why).
        host: the host the rank ran on (None: neither the trace nor its file name says); the ranks of
            one host share a clock, the others' are aligned at their collectives.
    """

    format: int
    rank: int | None
    world_size: int | None
    base_us: float
    steps: list[StepWork]
    step_mean_us: float | None
    findings: list[Finding]
    gaps: list[Gap]
    comm_source: str | None
    pg_config: list[dict[str, Any]]
    collectives: CompactRecords
    mfu_inputs: MfuInputs | None
    host: str | None = None

    def comms(self, rank: int, file: str = "") -> RankComms:
        """The rank's collectives as :func:`~torchprof_args.analysis.analyzers.collectives.rank_collectives`
        gave them (``torchprof collectives``, the cross-rank kinds)."""
        spans = [StepSpan(name=s.name, start_us=s.start_us, dur_us=s.dur_us) for s in self.steps]
        return RankComms(rank=rank, file=file, source=self.comm_source, records=self.collectives.records(),
                         world_size=self.world_size, pg_config=self.pg_config, host=self.host,
                         steps=absolute_steps(spans, self.base_us))


class JobGap(msgspec.Struct, frozen=True):
    """A gap of the job: the ranks whose traces lack what ``kind`` needs."""

    kind: str
    reason: str
    flag: str | None
    ranks: list[int]


class JobDiagnosis(msgspec.Struct, frozen=True):
    """One cycle's diagnosis: ``torchprof diagnose --json`` (docs/guides/diagnose.md's schema).

    Attributes:
        version: ``formats.FINDINGS.version``.
        path: the path diagnosed, as given.
        cycle: which cycle (``iterations A-B``), or None.
        ranks: how many ranks (traces) were diagnosed.
        step_ms: the job's step: the slowest rank's mean step (None without steps).
        findings: every kind's job-level finding, largest saving first (the savings predicted on
            the cycle's critical path where the graph can answer: each finding's ``saving_basis``).
        gaps: kinds the traces cannot answer, with the ranks.
        notes: what the savings could not use (a rank's graph missing, collectives not joined).
        clock: the hosts' clocks (:class:`~..analyzers.clocks.ClockAlignment`): on several hosts, every
            time was put on the first rank's host's clock before the ranks were compared.
    """

    version: int
    path: str
    cycle: str | None
    ranks: int
    step_ms: float | None
    findings: list[Finding]
    gaps: list[JobGap]
    notes: list[str] = msgspec.field(default_factory=list)
    clock: ClockAlignment | None = None
