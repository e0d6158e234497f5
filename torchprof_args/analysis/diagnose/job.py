"""``diagnose``: one cycle's ranks -> a ranked list of findings (what ``torchprof diagnose`` prints).

Two stages, so that 512 ranks need no trace parsed:

1. :func:`rank_diagnosis` (per rank, once, at publish time into the summary sidecar): the per-rank
   findings of :func:`~torchprof_args.analysis.diagnose.rank.rank_findings` and
   :func:`~.analyzers.pipeline_bubble.pipeline_bubble`, each step's work and collective time (for
   ``straggler``) and the rank's collective records in compact form (for ``collective_skew``);
2. :func:`diagnose` (per cycle): merges each kind's per-rank findings into one job-level finding,
   adds the cross-rank kinds and sorts by ``saving_ms_per_step``.

**How per-rank findings are merged.**  The ranks of a synchronous job meet at every step's
collectives, so a problem on any rank costs the whole job what it costs that rank: a kind's
job-level ``ms_per_step`` and ``saving_ms_per_step`` are the *worst rank's*, its ``ranks`` every
rank that has it, its evidence the worst rank's plus ``per_rank_ms`` (min / median / max over the
affected ranks) and ``worst_rank``.  ``step_ms`` is the slowest rank's mean step: the pace the job
advances at (a rank that loses time between its steps has shorter steps, not a faster job).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchprof_args.analysis.analyzers.collective_match import match_collectives
from torchprof_args.analysis.analyzers.collectives import RankComms, rank_collectives
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.collect.sidecar import read_diagnosis
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.diagnose.finding import FINDINGS_VERSION, Finding, Gap
from torchprof_args.analysis.diagnose.kinds.collective_skew import (
    SKEW_MIN_MS,
    SKEW_MIN_PCT,
    collective_skew,
    compact_records,
    matched_instances,
    records_from_compact,
    waited_us,
)
from torchprof_args.analysis.diagnose.kinds.low_mfu import judge, mfu_inputs
from torchprof_args.analysis.diagnose.kinds.pipeline_bubble import pipeline_bubble
from torchprof_args.analysis.diagnose.kinds.straggler import step_work, straggler
from torchprof_args.analysis.diagnose.rank import rank_findings
from torchprof_args.analysis.summary import finite
from torchprof_args.analysis.trace import Trace
from torchprof_args.errors import TraceError
from torchprof_args.naming import rank_from_file_name

__all__ = ["DIAGNOSIS_FORMAT", "Gathered", "diagnose", "gather", "merge_kind", "rank_diagnosis"]

#: the version of :func:`rank_diagnosis`'s document (kept in the summary sidecar).
DIAGNOSIS_FORMAT = 2


def _per_rank_items(trace: Trace) -> list[Finding | Gap]:
    """The per-rank analyzers' findings and gaps, then this module's pipeline bubble."""
    items: list[Finding | Gap] = list(rank_findings(trace))
    if not any(i.kind == "pipeline_bubble" for i in items):
        bubble = pipeline_bubble(trace)
        if bubble is not None:
            items.append(bubble)
    return items


def rank_diagnosis(trace: Trace) -> dict[str, Any]:
    """One rank's part of the diagnosis, JSON (what the summary sidecar keeps).

    ``trace`` should be loaded with ``comms=True``; without its communication events the rank has no
    collective records (no ``collective_skew``, and ``straggler`` counts the whole step as work).
    """
    items = _per_rank_items(trace)
    comms = rank_collectives(trace) if trace.comms is not None else None
    records = comms.records if comms is not None else []
    base_us = trace.base_time_ns / 1000.0
    work = step_work(steps(trace), records, base_us)
    mfu = mfu_inputs(trace)
    return {
        "format": DIAGNOSIS_FORMAT,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "base_us": base_us,
        "steps": work,
        "step_mean_us": statistics.fmean(s["dur_us"] for s in work) if work else None,
        "findings": [i.to_json() for i in items if isinstance(i, Finding)],
        "gaps": [i.to_json() for i in items if isinstance(i, Gap)],
        "comm_source": comms.source if comms is not None else None,
        "pg_config": comms.pg_config if comms is not None else [],
        "collectives": compact_records(records),
        "mfu_inputs": None if isinstance(mfu, Gap) else mfu,  # judged again with diagnose --peak-tflops
    }


def merge_kind(findings: Sequence[Finding], n_ranks: int, step_ms: float | None) -> Finding:
    """One job-level finding from the per-rank findings of one kind (see the module's docstring)."""
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


def _rank_of(doc: dict[str, Any], index: int) -> int:
    return doc["rank"] if isinstance(doc.get("rank"), int) else index


def _cross_rank(docs: list[dict[str, Any]], step_ms: float | None) -> list[Finding]:
    """``straggler`` and ``collective_skew`` from one matching of the ranks' collectives; the skew
    the stragglers explain is not counted twice."""
    comms = [RankComms(rank=d["rank"], file=d.get("file", ""), source=d.get("comm_source"),
                       records=records_from_compact(d.get("collectives")), world_size=d.get("world_size"),
                       pg_config=d.get("pg_config") or []) for d in docs]
    report = match_collectives(comms, top=5) if sum(1 for c in comms if c.records) >= 2 else None
    waits = waited_us(report) if report is not None and matched_instances(report) else None
    slow = straggler(docs, step_ms, waits)
    n_steps = max((len(d.get("steps") or []) for d in docs), default=1)
    bases = {d["rank"]: d.get("base_us", 0.0) for d in docs}
    skew = collective_skew(report, n_steps, step_ms, bases) if report is not None else None
    if slow is not None and skew is not None:
        skew = _beyond_stragglers(skew, slow, step_ms)
    return [f for f in (slow, skew) if f is not None]


def _beyond_stragglers(skew: Finding, slow: Finding, step_ms: float | None) -> Finding | None:
    """The skew left once the stragglers' extra work is taken out (their lateness *is* that work):
    the waiting each straggler caused, up to its excess, is subtracted; None when nothing is left
    above the threshold."""
    caused = skew.evidence.get("wait_caused_ms_per_step") or {}
    excess = slow.evidence.get("excess_ms_per_step") or {}
    explained = sum(min(caused.get(r, 0.0), x) for r, x in excess.items())
    left = skew.ms_per_step - explained
    if left <= max(SKEW_MIN_MS, SKEW_MIN_PCT / 100.0 * (step_ms or 0.0)):
        return None
    return replace(skew, ms_per_step=left, saving_ms_per_step=left,
                   share_of_step=left / step_ms if step_ms else skew.share_of_step,
                   summary=f"{skew.summary[:-1]}; {left:.1f} ms of it beyond the stragglers' extra work.",
                   evidence={**skew.evidence, "explained_by_straggler_ms": round(explained, 3)})


def _merged_gaps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    gaps: dict[tuple[str, str | None], dict[str, Any]] = {}
    for doc in docs:
        for gap in doc.get("gaps") or []:
            entry = gaps.setdefault((gap["kind"], gap.get("flag")), {**gap, "ranks": []})
            entry["ranks"].append(doc["rank"])
    return list(gaps.values())


def _with_peak(doc: dict[str, Any], peak_tflops: float | None, dtype: str) -> dict[str, Any]:
    """``doc`` with its ``low_mfu`` judged again against ``peak_tflops`` / ``dtype`` (from the stored
    MFU inputs: the sidecar's finding used the table's bf16 peak)."""
    inputs = doc.get("mfu_inputs")
    if inputs is None:
        return doc
    findings = [f for f in doc.get("findings") or [] if f["kind"] != "low_mfu"]
    gaps = [g for g in doc.get("gaps") or [] if g["kind"] != "low_mfu"]
    others = sum(f["saving_ms_per_step"] for f in findings)
    judged = judge(inputs, peak_tflops, dtype, others_ms=others)
    if isinstance(judged, Finding):
        findings.append(judged.to_json())
    elif isinstance(judged, Gap):
        gaps.append(judged.to_json())
    return {**doc, "findings": findings, "gaps": gaps}


def diagnose(rank_docs: Sequence[dict[str, Any]], path: str | Path, cycle: str | None = None, *,
             peak_tflops: float | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """The job's diagnosis from one cycle's :func:`rank_diagnosis` documents (``--json``'s schema).

    ``peak_tflops`` (a device the table lacks) or ``dtype`` (e.g. fp8 training) change the peak
    ``low_mfu`` compares with."""
    docs = [{**d, "rank": _rank_of(d, i)} for i, d in enumerate(rank_docs)]
    if peak_tflops is not None or dtype != "bf16":
        docs = [_with_peak(d, peak_tflops, dtype) for d in docs]
    means = [d["step_mean_us"] for d in docs if d.get("step_mean_us")]
    step_ms = max(means) / 1e3 if means else None
    by_kind: dict[str, list[Finding]] = {}
    for doc in docs:
        for item in doc.get("findings") or []:
            # a per-rank finding is about its document's rank (a trace without distributedInfo is
            # numbered from its file name here, which its analyzer could not know)
            finding = Finding.from_json({**item, "ranks": [doc["rank"]]})
            by_kind.setdefault(finding.kind, []).append(finding)
    findings = [merge_kind(group, len(docs), step_ms) for group in by_kind.values()]
    findings += _cross_rank(docs, step_ms)
    findings.sort(key=lambda f: (-f.saving_ms_per_step, f.kind))
    return {
        "version": FINDINGS_VERSION, "path": str(path), "cycle": cycle, "ranks": len(docs),
        "step_ms": step_ms, "findings": [f.to_json() for f in findings], "gaps": _merged_gaps(docs),
    }


@dataclass
class Gathered:
    """One cycle's rank documents (input order, failed traces left out) and what it took."""

    docs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    from_sidecars: int = 0
    parsed_bytes: int = 0
    parse_seconds: float = 0.0


def gather(files: Sequence[Path], *, reparse: bool = False, workers: int | None = None,
           progress: bool = False) -> Gathered:
    """Each trace's :func:`rank_diagnosis`: from its sidecar when it matches and holds one (unless
    ``reparse``), else parsed (decoded like ``summary``'s, with the communication events and FLOP
    counts).  A trace that cannot be read is one line in ``errors``; the others go on."""
    out = Gathered()
    for path in files:
        doc = None if reparse else read_diagnosis(path)
        if doc is not None and doc.get("format") == DIAGNOSIS_FORMAT:
            out.docs.append(doc)
            out.from_sidecars += 1
            continue
        started = time.perf_counter()
        try:
            trace = load_trace(path, progress=progress, workers=workers, comms=True, flops=True)
            doc = finite(rank_diagnosis(trace))
            out.parsed_bytes += trace.uncompressed_bytes
            del trace
        except TraceError as exc:
            out.errors.append(str(exc))
            continue
        except OSError as exc:
            out.errors.append(f"{path}: cannot be read ({exc.strerror or exc})")
            continue
        out.parse_seconds += time.perf_counter() - started
        doc["file"] = str(path)
        out.docs.append(doc)
    for doc in out.docs:
        if doc.get("rank") is None:
            doc["rank"] = rank_from_file_name(Path(doc["file"]).name)
    return out
