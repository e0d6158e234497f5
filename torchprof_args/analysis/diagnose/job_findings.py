"""``diagnose``: one cycle's rank parts -> the job's ranked findings (what ``torchprof diagnose`` prints).

:func:`diagnose` takes each rank's :class:`~.documents.RankDiagnosis` (from its sidecar, or parsed:
:mod:`torchprof_args.analysis.collect`), merges each per-rank kind's findings into one job-level
finding, runs the registry's cross-rank kinds over the ranks' parts and sorts by
``saving_ms_per_step``.

**How per-rank findings are merged.**  The ranks of a synchronous job meet at every step's
collectives, so a problem on any rank costs the whole job what it costs that rank: a kind's
job-level ``ms_per_step`` and ``saving_ms_per_step`` are the *worst rank's*, its ``ranks`` every
rank that has it, its evidence the worst rank's plus ``per_rank_ms`` (min / median / max over the
affected ranks) and ``worst_rank``.  ``step_ms`` is the slowest rank's mean step: the pace the job
advances at (a rank that loses time between its steps has shorter steps, not a faster job).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import msgspec

from torchprof_args.analysis.critical_path.cycle import cycle_graph
from torchprof_args.analysis.critical_path.reduced import RankPaths
from torchprof_args.analysis.diagnose.context import KindContext, Peak
from torchprof_args.analysis.diagnose.cycle import CycleRanks
from torchprof_args.analysis.diagnose.documents import JobDiagnosis, JobGap, RankDiagnosis
from torchprof_args.analysis.diagnose.expert_tokens import ExpertTokens
from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.diagnose.kinds import low_mfu
from torchprof_args.analysis.diagnose.registry import CROSS_RANK
from torchprof_args.analysis.diagnose.savings import on_the_graph
from torchprof_args.analysis.diagnose.step_timers import FormulaFlops
from torchprof_args.analysis.memory.categories import MemoryPart
from torchprof_args.shared import formats

__all__ = ["diagnose", "merge_kind"]


def merge_kind(findings: Sequence[Finding], n_ranks: int, step_ms: float | None) -> Finding:
    """One job-level finding from the per-rank findings of one kind (see the module's docstring).

    Args:
        findings: one kind's findings, one per rank that has it.
        n_ranks: the ranks diagnosed.
        step_ms: the job's step (the share of the step is the worst rank's time over it).

    Returns:
        The worst rank's finding, naming every rank that has the kind.
    """
    worst = max(findings, key=lambda f: (f.saving_ms_per_step, f.ms_per_step))
    ranks = tuple(sorted({r for f in findings for r in f.ranks}))
    if len(findings) == 1:
        return worst
    values = sorted(f.ms_per_step for f in findings)
    evidence = {**worst.evidence, "worst_rank": worst.ranks[0] if worst.ranks else None,
                "per_rank_ms": {"ranks": len(findings), "min": round(values[0], 3),
                                "median": round(statistics.median(values), 3), "max": round(values[-1], 3)}}
    return Finding(
        kind=worst.kind, summary=f"On {len(ranks)} of {n_ranks} ranks (worst: {worst.summary[0].lower()}"
        f"{worst.summary[1:].rstrip('.')}).", ranks=ranks, ms_per_step=worst.ms_per_step,
        share_of_step=worst.ms_per_step / step_ms if step_ms else worst.share_of_step,
        saving_ms_per_step=worst.saving_ms_per_step,
        saving_bound=(f"{worst.saving_bound}; the worst rank's (the others wait for it at the next "
                      "collective)"),
        remedy=worst.remedy, evidence=evidence,
    )


def _cross_rank(ranks: CycleRanks, formula: FormulaFlops | None,
                expert_tokens: ExpertTokens | None = None) -> list[Finding]:
    """The registry's cross-rank kinds in order, each told the findings before it."""
    found: list[Finding] = []
    kind_ctx = KindContext(formula=formula, expert_tokens=expert_tokens)
    for kind in CROSS_RANK:
        result = kind.analyze(ranks, kind_ctx.after(found))
        if isinstance(result, Finding):
            found.append(result)
    return found


def _merged_gaps(ranks: CycleRanks) -> list[JobGap]:
    gaps: dict[tuple[str, str | None], JobGap] = {}
    for part in ranks.parts:
        for gap in part.gaps:
            entry = gaps.setdefault((gap.kind, gap.flag), JobGap(gap.kind, gap.reason, gap.flag, []))
            entry.ranks.append(ranks.rank_of(part))
    return list(gaps.values())


def with_mfu_judged(part: RankDiagnosis, peak: Peak) -> RankDiagnosis:
    """``part`` with its ``low_mfu`` judged, the one time it is, from its MFU inputs against
    ``peak``, after the rank's other findings.

    Args:
        part: one rank's part (its ``low_mfu`` not judged: :func:`~.rank.rank_diagnosis`).
        peak: the device table's bf16 peak, or the one ``diagnose --peak-tflops`` / ``--peak-dtype``
            asks for.

    Returns:
        The part with its ``low_mfu`` finding or gap (unchanged without MFU inputs: its gap says why).
    """
    if part.mfu_inputs is None:
        return part
    judged = low_mfu.judge(part.mfu_inputs, KindContext(earlier=tuple(part.findings), peak=peak))
    if isinstance(judged, Finding):
        return msgspec.structs.replace(part, findings=[*part.findings, judged])
    if isinstance(judged, Gap):
        return msgspec.structs.replace(part, gaps=[*part.gaps, judged])
    return part


def diagnose(parts: Sequence[RankDiagnosis], path: str | Path, cycle: str | None = None, *,
             peak_tflops: float | None = None, dtype: str = "bf16",
             paths: Sequence[RankPaths] | None = None, memory: Sequence[MemoryPart] = (),
             align_clocks: bool = True, formula: FormulaFlops | None = None,
             expert_tokens: ExpertTokens | None = None) -> JobDiagnosis:
    """The job's diagnosis from one cycle's rank parts (``--json``'s schema).

    Args:
        parts: each rank's part (a part without a rank is numbered by its position).
        path: the path diagnosed, as given.
        cycle: which cycle (``iterations A-B``), for the reader.
        peak_tflops: the GPU's dense peak for ``low_mfu`` (a device the table lacks).
        dtype: which of the table's peaks ``low_mfu`` compares with (e.g. fp8 training).
        paths: each rank's reduced graph, in the order of ``parts``: the savings are then the
            critical path's (:mod:`.savings`); None: the per-rank bounds.
        memory: the ranks' memory parts (``memory_imbalance``), when read.
        align_clocks: whether the hosts' clocks are aligned (False: estimated and said, not applied).
        formula: the step timers' FLOPs per GPU and iteration (``mfu_disagreement``), where logged.
        expert_tokens: the framework's tokens per expert (``expert_imbalance``), where logged.

    Returns:
        The :class:`JobDiagnosis`: findings by saving (largest first), then the gaps.
    """
    peak = Peak(peak_tflops, dtype)
    ranks = CycleRanks([with_mfu_judged(p, peak) for p in parts], memory, align_clocks=align_clocks)
    by_kind: dict[str, list[Finding]] = {}
    for part in ranks.parts:
        for item in part.findings:
            # a per-rank finding is about its part's rank (a trace without distributedInfo is
            # numbered from its file name or position here, which its kind could not know)
            finding = msgspec.structs.replace(item, ranks=(ranks.rank_of(part),))
            by_kind.setdefault(finding.kind, []).append(finding)
    findings = [merge_kind(group, len(ranks.parts), ranks.step_ms) for group in by_kind.values()]
    findings += _cross_rank(ranks, formula, expert_tokens)
    notes: list[str] = []
    if paths is not None and len(paths) == len(ranks.parts):
        numbered = {id(p): ranks.rank_of(ranks.parts[i]) for i, p in enumerate(paths)}
        graph = cycle_graph(paths, rank_of=lambda p, i: numbered[id(p)], clock=ranks.clock)
        notes = list(dict.fromkeys(graph.notes))
        if graph.joined_reliably:
            findings = on_the_graph(findings, graph)
        else:
            findings = [msgspec.structs.replace(f, bound_ms_per_step=f.saving_ms_per_step) for f in findings]
            notes.append("savings are per-rank bounds: the ranks' collectives could not be joined on the "
                         "critical path (their clocks, or the order of their collectives, disagree)")
    else:
        findings = [msgspec.structs.replace(f, bound_ms_per_step=f.saving_ms_per_step) for f in findings]
        notes.append("savings are per-rank bounds: the traces' sidecars hold no critical-path graph "
                     "(torchprof diagnose --reparse builds it)")
    findings.sort(key=lambda f: (-f.saving_ms_per_step, f.kind))
    return JobDiagnosis(version=formats.FINDINGS.version, path=str(path), cycle=cycle, ranks=len(ranks.parts),
                        step_ms=ranks.step_ms, findings=findings, gaps=_merged_gaps(ranks), notes=notes,
                        clock=ranks.clock)
