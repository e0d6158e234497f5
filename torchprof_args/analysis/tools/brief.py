"""``torchprof brief``: one cycle (or a run's latest) in at most N tokens, the most important first.

Composed from the documents the other commands print, never from the traces again: the step time
(``diagnose``'s) and its trend over the run (``metrics.jsonl``'s ``iteration-time``), the top findings
with their savings and the ranks they name (``diagnose``), the odd ranks out (the summaries' cross-rank
view: the straggler rule over each rank's mean step), the critical path's top items, the memory peak
and its main category (``mem``), a hang's odd rank (``hang``), the hosts' clocks, and one line of
what was not recorded (with the flag that records it).  Each line has a priority; the brief drops the
least important lines until it fits ``max_tokens`` by :func:`~.tokens.token_counter`'s count, and
says how many it left out.  Ranks are named as runs with their host (``40-47 (node005)``), never one
line per rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from torchprof_args.analysis.critical_path.path import CriticalPathDoc
from torchprof_args.analysis.diagnose.documents import JobDiagnosis
from torchprof_args.analysis.memory.categories import MEMORY_CATEGORIES, human_bytes
from torchprof_args.analysis.memory.report import MemoryReport
from torchprof_args.analysis.render.gaps import group_gaps
from torchprof_args.analysis.summary.cross_rank import CrossRankView
from torchprof_args.analysis.tools.tokens import TokenCounter, token_counter
from torchprof_args.shared.stragglers import STRAGGLER_THRESHOLD

__all__ = [
    "Brief", "BriefInputs", "BriefLine", "StepTrend", "brief", "fit", "rank_runs",
    "step_trend",
]

#: findings listed (the first with its remedy).
FINDINGS = 5
#: a finding saving less than this share of the step (%) is among the last lines kept.
MINOR_SHARE_PCT = 1.0
#: runs of ranks named before ``and N more``.
RUNS_NAMED = 4


class BriefLine(NamedTuple):
    """One line of the brief: its priority (0, the top finding, kept longest), what it is (named when
    dropped), its text."""

    priority: int
    name: str
    text: str


class StepTrend(NamedTuple):
    """The step time over a run (``metrics.jsonl``'s ``iteration-time``, seconds): the median of its
    first and last thirds, how many intervals."""

    first_s: float
    last_s: float
    intervals: int


@dataclass
class BriefInputs:
    """What the brief is composed from (each None where it could not be computed).

    Attributes:
        path: the path given.
        diagnosis: ``diagnose``'s document.
        view: the summaries' cross-rank view.
        critical: ``critical-path``'s document (None: no rank's graph recorded).
        memory: ``mem``'s report (None, or without a peak: no memory events).
        trend: the run's step time over time (None: no ``metrics.jsonl``).
        hang: ``hang``'s report (None: no flight-recorder dumps or stacks).
        hosts: each rank's host, where known.
        not_recorded: what could not be computed, one short clause each (the flag that records it).
    """

    path: str
    diagnosis: JobDiagnosis | None = None
    view: CrossRankView | None = None
    critical: CriticalPathDoc | None = None
    memory: MemoryReport | None = None
    trend: StepTrend | None = None
    hang: dict[str, Any] | None = None
    hosts: dict[int, str] = field(default_factory=dict)
    not_recorded: list[str] = field(default_factory=list)


class Brief(msgspec.Struct, frozen=True):
    """``torchprof brief --json``: the text, its tokens (``tokenizer``'s count), the lines dropped."""

    text: str
    tokens: int
    max_tokens: int
    tokenizer: str
    dropped: list[str]


def step_trend(samples: Sequence[float]) -> StepTrend | None:
    """The median of the first and of the last third of a run's step times (None under 3 samples)."""
    if len(samples) < 3:
        return None
    third = len(samples) // 3
    return StepTrend(statistics.median(samples[:third]), statistics.median(samples[-third:]), len(samples))


def rank_runs(ranks: Sequence[int], hosts: dict[int, str] | None = None, of: int | None = None) -> str:
    """``40-47 (node005), 96`` : runs of consecutive ranks, each with its host where all its ranks share
    one; ``all 512 ranks`` when every rank; the first :data:`RUNS_NAMED` runs, then ``and N more``.

    Args:
        ranks: the ranks.
        hosts: each rank's host.
        of: how many ranks the cycle has.

    Returns:
        The text.
    """
    unique = sorted(set(ranks))
    if not unique:
        return "none"
    if of is not None and len(unique) == of and of > 2:
        return f"all {of} ranks"
    hosts = hosts or {}
    runs: list[list[int]] = []
    for rank in unique:
        if runs and rank == runs[-1][-1] + 1 and hosts.get(rank) == hosts.get(runs[-1][-1]):
            runs[-1].append(rank)
        else:
            runs.append([rank])
    texts = []
    for run in runs[:RUNS_NAMED]:
        text = f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run))
        host = hosts.get(run[0])
        texts.append(f"{text} ({host})" if host else text)
    more = len(runs) - RUNS_NAMED
    return ", ".join(texts) + (f" and {more} more runs of ranks" if more > 0 else "")


def _ranks_word(ranks: Sequence[int], hosts: dict[int, str], of: int | None) -> str:
    text = rank_runs(ranks, hosts, of)
    return text if text.startswith("all ") else f"rank{'s' if len(set(ranks)) > 1 else ''} {text}"


def _headline(inp: BriefInputs) -> list[BriefLine]:
    doc, view = inp.diagnosis, inp.view
    ranks = doc.ranks if doc is not None else len(view.ranks) if view is not None else 0
    hosts = len(set(inp.hosts.values()))
    cycle = doc.cycle if doc is not None else None
    step = doc.step_ms if doc is not None else None
    head = (f"{ranks} rank{'s' if ranks != 1 else ''}" + (f" on {hosts} hosts" if hosts > 1 else "")
            + (f", {cycle}" if cycle else ""))
    if step is not None:
        head += f": step {step:.1f} ms (the slowest rank's mean"
        median = view.distributions.step_mean_us.p50 if view is not None else None
        head += f"; median rank {median / 1e3:.1f} ms)" if median is not None else ")"
    lines = [BriefLine(1, "headline", f"torchprof brief: {head}")]
    if inp.trend is not None:
        t = inp.trend
        change = 100.0 * (t.last_s - t.first_s) / t.first_s if t.first_s else 0.0
        lines.append(BriefLine(1, "trend", f"step time over the run: {t.first_s * 1e3:.1f} -> "
                               f"{t.last_s * 1e3:.1f} ms ({change:+.1f} %, first vs last third of "
                               f"{t.intervals} logged intervals)"))
    return lines


def _findings(inp: BriefInputs) -> list[BriefLine]:
    doc = inp.diagnosis
    if doc is None:
        return []
    if not doc.findings:
        return [BriefLine(1, "findings", "no finding: nothing diagnose checks costs a share of the step")]
    lines = []
    for i, f in enumerate(doc.findings[:FINDINGS]):
        where = "on the critical path" if f.saving_basis == "critical path" else "bound"
        share = 100.0 * f.saving_ms_per_step / doc.step_ms if doc.step_ms else 0.0
        head = (f"{i + 1}. {f.kind}: saves {f.saving_ms_per_step:.1f} ms/step ({share:.1f} % of the step, "
                f"{where}), {_ranks_word(f.ranks, inp.hosts, doc.ranks)}")
        if i == 0:
            lines.append(BriefLine(0, f"finding {f.kind}", head))
            lines.append(BriefLine(2, f"finding {f.kind}: what", f"   {f.summary}"))
            lines.append(BriefLine(4, f"finding {f.kind}: fix", f"   fix: {f.remedy}"))
        else:
            small = share < MINOR_SHARE_PCT
            lines.append(BriefLine(6 if small or i >= 3 else 3, f"finding {f.kind}", head))
    more = len(doc.findings) - FINDINGS
    if more > 0:
        lines.append(BriefLine(7, "findings: more", f"   and {more} more findings (`torchprof diagnose`)"))
    return lines


def _odd_ranks(inp: BriefInputs) -> list[BriefLine]:
    """The ranks out of line: by mean step (the cross-rank view), else by work outside collectives
    (``diagnose``'s straggler: in a synchronous job every rank's step is as long)."""
    view, doc = inp.view, inp.diagnosis
    n = doc.ranks if doc is not None else len(view.ranks) if view is not None else 0
    if n < 2:
        return []
    straggler = next((f for f in doc.findings if f.kind == "straggler"), None) if doc is not None else None
    if view is not None and view.stragglers:
        slow = [r.rank for r in view.stragglers]
        text = (f"{len(slow)} of {n} ranks work {view.straggler_threshold:g}x the others' median or "
                f"more outside collectives: {rank_runs(slow, inp.hosts, n)}")
    elif straggler is not None:
        text = (f"{len(straggler.ranks)} of {n} ranks work {STRAGGLER_THRESHOLD:g}x the others' median or "
                f"more outside collectives: {rank_runs(straggler.ranks, inp.hosts, n)}")
    elif view is not None and view.step_mean_us is not None:
        text = (f"no rank stands out (work spread {view.spread_pct or 0.0:.1f} % of the step: slowest rank "
                f"{view.slowest_rank}, fastest {view.fastest_rank})")
    else:
        return []
    return [BriefLine(1, "odd ranks", text)]


def _critical(inp: BriefInputs) -> list[BriefLine]:
    doc = inp.critical
    if doc is None or not doc.steps:
        return []
    by_rank: dict[str, float] = {}
    by_category: dict[str, float] = {}
    for step in doc.steps:
        for key, ms in step.by_rank.items():
            by_rank[key] = by_rank.get(key, 0.0) + ms
        for key, ms in step.by_category.items():
            by_category[key] = by_category.get(key, 0.0) + ms
    total = sum(by_rank.values()) or 1.0
    ranks = sorted(by_rank, key=lambda k: -by_rank[k])
    on = ", ".join(f"{_ranks_word([int(k)], inp.hosts, None)} {100 * by_rank[k] / total:.0f} %"
                   for k in ranks[:3])
    cats = sorted(by_category, key=lambda k: -by_category[k])
    cat_total = sum(by_category.values()) or 1.0
    kinds = ", ".join(f"{k} {100 * by_category[k] / cat_total:.0f} %" for k in cats[:3])
    lines = [BriefLine(2, "critical path", f"critical path: through {on}; {kinds}")]
    if doc.top:
        items = "; ".join(f"{t.name[:60]} {t.ms_per_step:.1f} ms (rank {t.rank})" for t in doc.top[:3])
        lines.append(BriefLine(3, "critical path: top", f"   on it, per step: {items}"))
    return lines


def _memory(inp: BriefInputs) -> list[BriefLine]:
    report = inp.memory
    if report is None or report.peak is None:
        return []
    peak = report.peak
    by = msgspec.structs.asdict(peak.by_category)
    main = max(MEMORY_CATEGORIES, key=lambda k: by[k])
    share = 100.0 * by[main] / peak.bytes if peak.bytes else 0.0
    when = peak.when
    at = f" at {when.step}, {when.phase}" if when.step else f" in {when.phase}"
    text = f"memory peak: {human_bytes(peak.bytes)} on rank {peak.rank}{at} (mostly {main}, {share:.0f} %)"
    lines = [BriefLine(2, "memory", text)]
    if report.outliers:
        lines.append(BriefLine(5, "memory: outliers", f"   ranks holding more than the median: "
                               f"{rank_runs([o.rank for o in report.outliers], inp.hosts)}"))
    if report.findings:
        f = report.findings[0]
        lines.append(BriefLine(5, "memory: finding", f"   {f.kind} would free {human_bytes(f.bytes_freed)}: "
                               f"{f.remedy}"))
    return lines


def _hang(inp: BriefInputs) -> list[BriefLine]:
    report = inp.hang
    if report is None:
        return []
    lines = []
    for recorder in report.get("recorders") or []:
        for found in recorder.get("findings") or []:
            odd = found.get("missing_ranks") or found.get("mismatched_ranks") or []
            verb = "did not join" if found.get("missing_ranks") else "joined differently"
            lines.append(BriefLine(1, "hang", f"hang: {_ranks_word(odd, inp.hosts, None)} {verb} "
                                   f"{found.get('collective')} #{found.get('seq')} (process group "
                                   f"{found.get('pg')}); {rank_runs(found.get('joined') or [], inp.hosts)} "
                                   "wait in it"))
            break
    where = report.get("where")
    if where and where.get("groups"):
        groups = where["groups"]
        odd = groups[0]
        text = (f"{_ranks_word(odd['ranks'], inp.hosts, None)} at {odd['where']}"
                + (f"; {len(groups) - 1} other group(s) of ranks elsewhere" if len(groups) > 1 else ""))
        lines.append(BriefLine(1 if not lines else 4, "hang: where", f"hang: where the ranks are: {text}"))
    return lines[:2]


def _clock(inp: BriefInputs) -> list[BriefLine]:
    clock = inp.diagnosis.clock if inp.diagnosis is not None else None
    line = clock.line() if clock is not None else None
    return [BriefLine(6, "clock", line)] if line else []


def _gaps(inp: BriefInputs) -> list[BriefLine]:
    said = list(inp.not_recorded)
    if inp.diagnosis is not None:
        said += [f"{', '.join(g.kinds)} ({g.flag or 'no flag records it'})"
                 for g in group_gaps(inp.diagnosis.gaps)]
    return [BriefLine(5, "not recorded", "not recorded: " + "; ".join(said))] if said else []


def lines_of(inp: BriefInputs) -> list[BriefLine]:
    """Every line of the brief, in reading order, each with its priority.

    Args:
        inp: the documents.

    Returns:
        The lines.
    """
    return [*_headline(inp), *_findings(inp), *_odd_ranks(inp), *_hang(inp), *_critical(inp), *_memory(inp),
            *_clock(inp), *_gaps(inp)]


def fit(lines: Sequence[BriefLine], max_tokens: int, counter: TokenCounter | None = None) -> Brief:
    """The lines that fit ``max_tokens``: the least important dropped first (the last of equals first),
    with one closing line saying how many were left out (itself left out rather than the top finding);
    a text still too long is cut.

    Args:
        lines: the lines, in reading order.
        max_tokens: the budget, counted by ``counter``.
        counter: how tokens are counted (default: :func:`~.tokens.token_counter`).

    Returns:
        The brief; its ``tokens`` never exceed ``max_tokens``.
    """
    counter = counter or token_counter()
    kept = list(lines)
    dropped: list[BriefLine] = []

    def text_of(kept: list[BriefLine], closing: bool = True) -> str:
        body = [line.text for line in kept]
        if dropped and closing:
            word = "lines" if len(dropped) > 1 else "line"
            body.append(f"({len(dropped)} more {word} with a larger --max-tokens)")
        return "\n".join(body)

    text = text_of(kept)
    while kept and counter.count(text) > max_tokens:
        worst = max(range(len(kept)), key=lambda i: (kept[i].priority, i))
        if kept[worst].priority == 0 and counter.count(text_of(kept, closing=False)) <= max_tokens:
            text = text_of(kept, closing=False)  # the top finding rather than the closing line
            break
        dropped.append(kept.pop(worst))
        text = text_of(kept)
    while text and counter.count(text) > max_tokens:  # the closing line alone is too long: cut the text
        text = text[:max(0, min(len(text) - 1, len(text) * max_tokens // max(counter.count(text), 1)))]
    return Brief(text=text, tokens=counter.count(text), max_tokens=max_tokens, tokenizer=counter.name,
                 dropped=[line.name for line in dropped])


def brief(inp: BriefInputs, max_tokens: int, counter: TokenCounter | None = None) -> Brief:
    """The brief of one cycle.

    Args:
        inp: the documents it is composed from.
        max_tokens: the budget.
        counter: how tokens are counted (default: the real tokenizer where installed).

    Returns:
        The brief (``torchprof brief --json``).
    """
    return fit(lines_of(inp), max_tokens, counter)
