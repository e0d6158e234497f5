"""The text of a diagnosis (``torchprof diagnose``): per finding, one sentence, the saving per step
(on the critical path, beside its per-rank bound), the evidence with a timestamp to open in Perfetto,
the usual remedy; then what the traces cannot tell (:mod:`.gaps`).  At most :data:`MAX_LINES` lines."""

from __future__ import annotations

from collections.abc import Sequence

from torchprof_args.analysis.diagnose.documents import JobDiagnosis
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.jsonout import finite
from torchprof_args.analysis.render.gaps import gap_text_lines

__all__ = ["MAX_LINES", "format_diagnosis"]

#: the text output's budget of lines (header and gaps included).
MAX_LINES = 30


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _ranks(ranks: Sequence[int], of: int) -> str:
    if not ranks:
        return "ranks -"
    if len(ranks) == of and of > 2:
        return f"all {of} ranks"
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{' ...' if len(ranks) > 8 else ''}"


def _evidence(finding: Finding) -> str:
    """The evidence in one line: its scalars and small lists, then the Perfetto timestamp."""
    parts = []
    ev = finite(finding.evidence)  # as --json prints it
    for key, value in ev.items():
        if key.startswith("perfetto"):
            continue
        if isinstance(value, dict):
            inner = ", ".join(f"{k} {v}" for k, v in list(value.items())[:4])
            parts.append(f"{key}: {inner}")
        elif isinstance(value, list):
            names = [v.get("name", v) if isinstance(v, dict) else v for v in value[:3]]
            parts.append(f"{key}: {'; '.join(str(n)[:60] for n in names)}")
        elif value is not None:
            parts.append(f"{key} {value}")
    text = "; ".join(parts)
    if len(text) > 200:
        text = text[:197] + "..."
    ts = ev.get("perfetto_ts_us")
    if ts is not None:
        rank = ev.get("perfetto_rank", ev.get("worst_rank", finding.ranks[0] if finding.ranks else None))
        text += f" | Perfetto: rank {rank} at ts {ts:,.0f} us"
    return text


def _saving(finding: Finding, step_ms: float | None) -> str:
    """``saves 12.5 ms/step (16.4 % of the step; on the critical path, per-rank bound 41.4 ms)``: the
    share printed is the saving's share of the job's step."""
    saving = finding.saving_ms_per_step
    share = f"{100 * saving / step_ms:.1f} % of the step; " if step_ms else ""
    bound = finding.bound_ms_per_step
    if finding.saving_basis == "critical path":
        tail = "on the critical path" + (f", per-rank bound {_ms(bound)}" if bound is not None else "")
        return f"saves {_ms(saving)}/step ({share}{tail})"
    return f"saves up to {_ms(saving)}/step ({share}per-rank bound)"


def format_diagnosis(doc: JobDiagnosis, max_lines: int = MAX_LINES) -> str:
    """The text ``torchprof diagnose`` prints for a diagnosis.

    Args:
        doc: :func:`~torchprof_args.analysis.diagnose.job_findings.diagnose`'s result.
        max_lines: the budget of lines, header and gaps included; findings that do not fit are
            counted in one line.

    Returns:
        The text, without a final newline.
    """
    findings, gaps = doc.findings, doc.gaps
    head = (f"torchprof diagnose: {doc.ranks} rank{'s' if doc.ranks != 1 else ''}, step "
            f"{_ms(doc.step_ms)}" + (f", {doc.cycle}" if doc.cycle else "")
            + f": {len(findings)} finding{'s' if len(findings) != 1 else ''}")
    lines = [head]
    if doc.clock is not None and (clock := doc.clock.line()):
        lines.append(f"  {clock}")
    if not findings:
        lines.append("  nothing above the documented thresholds (docs/guides/diagnose.md)")
    gap_lines = gap_text_lines(gaps)
    budget = max_lines - 1 - min(len(gap_lines), 4) - 1
    for n, f in enumerate(findings, 1):
        if len(lines) + 4 > budget and n < len(findings):
            lines.append(f"  ... {len(findings) - n + 1} more finding(s) in --json")
            break
        lines.append(f"{n}. {f.kind}: {_saving(f, doc.step_ms)}, {_ranks(f.ranks, doc.ranks)}")
        lines.append(f"   {f.summary}")
        lines.append(f"   evidence: {_evidence(f)}")
        lines.append(f"   bound: {f.saving_bound}. Fix: {f.remedy}")
    lines += [f"  {line}" for line in gap_lines[: max(max_lines - len(lines), 0)]]
    return "\n".join(lines[:max_lines])
