"""Self-contained HTML report (inline SVG, no scripts, no network), built for many ranks.

One section per profiled cycle, opening with ``torchprof diagnose``'s findings (what to fix,
ranked by the step time each would save), then the distributions over ranks, a rank x step heatmap
of straggler scores (the dashboard's chart, :mod:`torchprof_args.shared.heatmap`), histograms of step
time, GPU idle and overlap across ranks, the straggler table, the kernel-type breakdown of the mean,
slowest, median and fastest rank, their top kernels, the slowest rank's compiled code (regions and
the modules they ran for, Triton kernels on the roofline), and every rank's row folded away.  Nothing is
drawn once per rank except one heatmap row, so 1,024 ranks read on one screen and the page stays a
few MB.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.gpu import GpuBreakdown
from torchprof_args.analysis.diagnose.documents import JobDiagnosis
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.render import svg
from torchprof_args.analysis.render.critical_path import path_section
from torchprof_args.analysis.render.gaps import gap_text_lines
from torchprof_args.analysis.render.memory import memory_section
from torchprof_args.analysis.render.text import fmt_pct, fmt_us
from torchprof_args.analysis.summary import CrossRankView, Summary
from torchprof_args.analysis.summary.cross_rank import WORK_LABEL, Distribution, RankRow
from torchprof_args.atomic import write_text_atomically
from torchprof_args.shared.heatmap import Layout, heatmap_svg
from torchprof_args.shared.stragglers import describe

__all__ = ["STRAGGLER_ROWS", "CycleSection", "render_report", "write_report"]

_STYLE = ("body{font-family:sans-serif;margin:24px;max-width:1400px}"
          "table{border-collapse:collapse;font-size:12px}"
          "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}td.n{text-align:right}"
          "h2{margin-top:36px;border-bottom:2px solid #4e79a7}svg{display:block;margin:8px 0}"
          ".row{display:flex;flex-wrap:wrap;gap:12px}")
_KINDS = ("computation", "communication", "memory")
#: straggler-table rows shown (the highest score first); the folded table has every rank.
STRAGGLER_ROWS = 20
#: a row per rank, one pixel high for 1,024 ranks (more fold into buckets); at most 150 steps.
_HEATMAP = Layout(width=900, height=1024, max_rows=1024, max_columns=150)
#: one cycle's section: its title, its ranks' summaries and its cross-rank view.
CycleSection = tuple[str, list[Summary], CrossRankView]


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{html.escape(str(c))}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _where(row: RankRow) -> str:
    par = row.parallel or {}
    coords = " ".join(f"{k}{v}" for k, v in par.items())
    return " ".join(x for x in (row.host or "", coords) if x) or "-"


def _rank_rows(rows: list[RankRow]) -> list[list[Any]]:
    return [[r.rank, _where(r), r.steps, fmt_us(r.step_mean_us), fmt_us(r.work_mean_us),
             "-" if r.straggler_score is None else f"{r.straggler_score:.2f}x",
             fmt_pct(r.idle_pct), fmt_pct(r.compute_pct), fmt_pct(r.comm_comp_overlap_pct), Path(r.file).name]
            for r in rows]


_RANK_HEADERS = ["rank", "host / parallel", "steps", "mean step", "work", "straggler score", "GPU idle",
                 "compute", "overlap", "file"]
#: the numeric columns of :data:`_RANK_HEADERS`.
_RANK_NUMERIC = {0, 2, 3, 4, 5, 6, 7, 8}


def _heatmap(view: CrossRankView) -> str:
    rows, names = view.ranks, view.steps
    if not names:
        return "<p>No ProfilerStep annotations in these traces: no per-step times.</p>"
    columns = [(n.replace("ProfilerStep", ""), [r.step_us.get(n) for r in rows]) for n in names]
    return heatmap_svg("Step time per rank and ProfilerStep: each rank's straggler score (its time over "
                       "the other ranks' median)", columns, _HEATMAP, against="others", x_name="step",
                       ranks=[r.rank for r in rows], fmt=fmt_us)


def _kind_ms(gpu: GpuBreakdown) -> dict[str, float]:
    """Exclusive time (ms) per kernel class, and the time where classes run at once."""
    parts = {k: gpu.kernel_type_us[k] / 1e3 for k in _KINDS}
    parts["overlap"] = sum(gpu.kernel_type_overlapping_us.values()) / 1e3
    return parts


def _breakdown(view: CrossRankView, by_rank: dict[int, Summary]) -> str:
    picked = [(label, by_rank[rank].gpu) for label, rank in _picks(view) if rank in by_rank]
    gpus = [(label, gpu) for label, gpu in picked if gpu is not None]
    if not gpus:
        return ""
    all_gpus = [s.gpu for s in by_rank.values() if s.gpu is not None]
    mean = {k: float(np.mean([g.kernel_type_us[k] for g in all_gpus])) / 1e3 for k in _KINDS}
    mean["overlap"] = float(np.mean([sum(g.kernel_type_overlapping_us.values()) for g in all_gpus])) / 1e3
    rows = [(f"mean of {len(all_gpus)} ranks", mean)] + [(label, _kind_ms(g)) for label, g in gpus]
    return "<h3>GPU kernel time by class</h3>" + svg.stacked_bars(
        "Kernel time by class, exclusive (ms); overlap = time where classes run at once", rows, "ms")


def _picks(view: CrossRankView) -> list[tuple[str, int]]:
    """(label, rank) of the slowest, median and fastest ranks."""
    timed = sorted((r for r in view.ranks if r.step_mean_us is not None), key=lambda r: r.step_mean_us or 0.0)
    if not timed:
        return [(f"rank {view.ranks[0].rank}", view.ranks[0].rank)] if view.ranks else []
    picks = {"slowest": timed[-1], "median": timed[len(timed) // 2], "fastest": timed[0]}
    out, seen = [], set()
    for label, r in picks.items():
        if r.rank not in seen:
            seen.add(r.rank)
            out.append((f"{label}: rank {r.rank}", r.rank))
    return out


def _top_kernels(view: CrossRankView, by_rank: dict[int, Summary]) -> str:
    parts = []
    for label, rank in _picks(view)[:2]:
        kernels = by_rank[rank].top_kernels if rank in by_rank else []
        if kernels:
            parts.append(f"<div><h4>Top kernels, {html.escape(label)}</h4>" + _table(
                ["kernel", "type", "calls", "total ms", "%"],
                [[k.name[:100], k.type, k.calls, f"{k.total_us / 1e3:,.3f}", f"{k.pct:.2f}"]
                 for k in kernels[:12]], {2, 3, 4}) + "</div>")
    return "<div class=row>" + "".join(parts) + "</div>" if parts else ""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _compiled(view: CrossRankView, by_rank: dict[int, Summary]) -> str:
    """The slowest rank's compiled regions (the modules each ran for) and its Triton kernels on the
    roofline (inductor's estimates against the device's peaks)."""
    picks = _picks(view)[:1]
    code = by_rank[picks[0][1]].compiled if picks and picks[0][1] in by_rank else None
    if code is None:
        return ""
    parts = [f"<h3>Compiled code, {html.escape(picks[0][0])}</h3>"]
    if code.regions:
        parts.append(_table(["compiled region / graph", "calls", "ms / step", "ran for"],
                            [[r.name, r.calls, f"{r.ms_per_step:,.3f}", ", ".join(r.modules)]
                             for r in code.regions[:12]], {1, 2}))
    if code.kernels:
        device = (f"{code.device}: {_num(code.peak_tflops, 1)} TFLOP/s bf16, {_num(code.peak_tbps, 2)} TB/s"
                  if code.device else "no GPU name in the trace")
        parts.append(f"<p>Triton kernels on the roofline (inductor's kernel_flop / kernel_num_gb; "
                     f"{html.escape(device)}; inductor's FLOPs cover {_pct(code.inductor_flop_share)} % "
                     f"of the kernel time)</p>")
        parts.append(_table(
            ["kernel", "calls", "ms / step", "GFLOP", "GB", "TFLOP/s", "TB/s", "bound", "% of roof",
             "ran for"],
            [[k.name[:100], k.calls, f"{k.ms_per_step:,.3f}", _num(k.gflop, 3), _num(k.gb, 4),
              _num(k.tflops, 1), _num(k.tbps, 2), k.bound or "-", _pct(k.of_roof), ", ".join(k.modules[:4])]
             for k in code.kernels[:12]], {1, 2, 3, 4, 5, 6, 8}))
    return "\n".join(parts)


def _saving_cell(finding: Finding) -> str:
    """The saving, on the critical path beside its per-rank bound, or the bound alone."""
    bound = finding.bound_ms_per_step
    if finding.saving_basis == "critical path" and bound is not None:
        return f"{finding.saving_ms_per_step:.1f} ms (bound {bound:.1f})"
    return f"up to {finding.saving_ms_per_step:.1f} ms"


def _findings(doc: JobDiagnosis | None) -> str:
    """The cycle's findings (``torchprof diagnose``), largest saving first, and its gaps."""
    if doc is None:
        return ""
    step = doc.step_ms or 0.0
    rows = [[i, f.kind, _saving_cell(f), fmt_pct(100.0 * f.saving_ms_per_step / step) if step else "-",
             ", ".join(str(r) for r in f.ranks[:16]) + (" ..." if len(f.ranks) > 16 else ""),
             f.summary, f.remedy] for i, f in enumerate(doc.findings, 1)]
    parts = ["<h3>What to fix (torchprof diagnose)</h3>"]
    if doc.clock is not None and (clock := doc.clock.line()):
        parts.append(f"<p>{html.escape(clock)}</p>")
    headers = ["#", "kind", "saves / step", "of the step", "ranks", "finding", "remedy"]
    parts.append(_table(headers, rows, {0, 2, 3}) if rows
                 else "<p>No finding above the documented thresholds.</p>")
    gaps = gap_text_lines(doc.gaps)  # one sentence per flag, as `torchprof diagnose` says it
    if gaps:
        items = "".join(f"<li>{html.escape(g)}</li>" for g in gaps)
        parts.append(f"<p>What the traces cannot tell:</p><ul>{items}</ul>")
    return "\n".join(parts)


def _cycle_section(title: str, summaries: list[Summary], view: CrossRankView,
                   findings: JobDiagnosis | None = None, path: dict[str, Any] | None = None,
                   memory: dict[str, Any] | None = None) -> str:
    by_rank = {(s.rank if s.rank is not None else i): s for i, s in enumerate(summaries)}
    rows = view.ranks
    parts = [f"<h2>{html.escape(title)} ({len(rows)} rank(s))</h2>", _findings(findings), path_section(path),
             _distributions(view)]
    if view.slowest_rank is not None:
        parts.append(f"<p>Slowest rank <b>{view.slowest_rank}</b>, fastest {view.fastest_rank} (by work per "
                     "step), spread "
                     f"{view.spread_pct:.2f}% of the mean step ({fmt_us(view.step_mean_us)}); "
                     f"{len(view.stragglers)} straggler(s) ({html.escape(_rule(view))}).</p>")
    parts += ["<h3>Step time per rank and step</h3>", _heatmap(view), "<h3>Across ranks</h3><div class=row>",
              svg.histogram("Mean step time", [r.step_mean_us for r in rows], fmt_us),
              svg.histogram("GPU idle (% of kernel-active span)", [r.idle_pct for r in rows], fmt_pct),
              svg.histogram("Communication overlapped by compute", [r.comm_comp_overlap_pct for r in rows],
                            fmt_pct),
              "</div>", "<h3>Stragglers</h3>", *_stragglers(view)]
    parts += [memory_section(memory), _breakdown(view, by_rank), _top_kernels(view, by_rank),
              _compiled(view, by_rank),
              f"<details><summary>All {len(rows)} ranks</summary>",
              _table(_RANK_HEADERS, _rank_rows(rows), _RANK_NUMERIC), "</details>"]
    return "\n".join(p for p in parts if p)


def _distribution_row(label: str, d: Distribution, fmt: Callable[[float | None], str]) -> list[Any]:
    return [label, *(fmt(q) if d.n else "-" for q in (d.min, d.p50, d.p90, d.max))]


def _distributions(view: CrossRankView) -> str:
    """Min / p50 / p90 / max over ranks of the mean step time, GPU idle and overlap."""
    dist = view.distributions
    return _table(["", "min", "p50", "p90", "max"],
                  [_distribution_row("mean step time", dist.step_mean_us, fmt_us),
                   _distribution_row("GPU idle", dist.idle_pct, fmt_pct),
                   _distribution_row("comm/comp overlap", dist.comm_comp_overlap_pct, fmt_pct)], {1, 2, 3, 4})


def _rule(view: CrossRankView) -> str:
    return describe(WORK_LABEL, view.straggler_threshold, view.straggler_min_ms)


def _stragglers(view: CrossRankView) -> list[str]:
    """The stragglers' table (at most :data:`STRAGGLER_ROWS`), else the slowest ranks'."""
    if not view.stragglers:
        return [f"<p>No straggler ({html.escape(_rule(view))}). Slowest ranks:</p>"
                + _table(_RANK_HEADERS, _rank_rows(view.slowest), _RANK_NUMERIC)]
    shown = view.stragglers[:STRAGGLER_ROWS]
    parts = [_table(_RANK_HEADERS, _rank_rows(shown), _RANK_NUMERIC)]
    if len(view.stragglers) > len(shown):
        parts.append(f"<p>... and {len(view.stragglers) - len(shown)} more (all ranks below).</p>")
    return parts


def render_report(cycles: list[CycleSection], findings: list[JobDiagnosis | None] | None = None,
                  paths: list[dict[str, Any] | None] | None = None,
                  memory: list[dict[str, Any] | None] | None = None) -> str:
    """The HTML page of a run.

    Args:
        cycles: each cycle's title, its ranks' summaries and its cross-rank view.
        findings: each cycle's ``torchprof diagnose`` result (None: that cycle's section has none).
        paths: each cycle's ``torchprof critical-path --json`` document (its strips; None: none).
        memory: each cycle's ``torchprof mem --json`` document (its timeline and findings; None: none).

    Returns:
        The self-contained page.
    """
    ranks = sum(len(s) for _, s, _ in cycles)
    head = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>torchprof report</title>",
            f"<style>{_STYLE}</style></head><body><h1>torchprof trace report</h1>",
            f"<p>{ranks} trace(s) in {len(cycles)} cycle(s). GPU numbers use Holistic Trace Analysis "
            "definitions; hover a cell or bar for its value.</p>"]
    found = findings or [None] * len(cycles)
    drawn = paths or [None] * len(cycles)
    memories = memory or [None] * len(cycles)
    sections = [_cycle_section(*c, f, p, m)
                for c, f, p, m in zip(cycles, found, drawn, memories, strict=True)]
    return "\n".join(head + sections + ["</body></html>"])


def write_report(cycles: list[CycleSection], output: str | Path,
                 findings: list[JobDiagnosis | None] | None = None,
                 paths: list[dict[str, Any] | None] | None = None,
                 memory: list[dict[str, Any] | None] | None = None) -> Path:
    """Publish :func:`render_report`'s page at ``output`` (atomically).

    Args:
        cycles: as :func:`render_report` takes them; ``findings``, ``paths`` and ``memory`` likewise.
        output: the HTML file to write.

    Returns:
        Its path.
    """
    output = Path(output)
    write_text_atomically(output, render_report(cycles, findings, paths, memory))
    return output
