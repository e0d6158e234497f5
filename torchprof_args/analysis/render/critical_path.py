"""The text of ``torchprof critical-path``: per step, the path's length beside the step's, its time
by rank and by category (on an FSDP2 job by FSDP2 phase too); then the operators and kernels with the
most time on the path, the what-ifs' answers and what the graph could not use."""

from __future__ import annotations

import html
from typing import Any

import msgspec

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment

__all__ = ["CATEGORY_COLORS", "format_critical_path", "path_line", "path_section", "path_strip"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _shares(values: dict[str, float], total: float, limit: int) -> str:
    ranked = sorted(values.items(), key=lambda kv: -kv[1])[:limit]
    return ", ".join(f"{k.replace('_', ' ')} {v:.1f} ({100 * v / total:.0f} %)" if total > 0 else k
                     for k, v in ranked)


def path_line(step: dict[str, Any]) -> str:
    """One step's path in one line: the step, its path and the difference, by category."""
    ranks = step["by_rank"]
    where = f"rank {next(iter(ranks))}" if len(ranks) == 1 else f"{len(ranks)} ranks"
    return (f"{step['step']}: step {_ms(step['step_ms'])} (rank {step['rank']}), path {_ms(step['path_ms'])} "
            f"(difference {step['difference_ms']:+.2f} ms) on {where}: "
            f"{_shares(step['by_category'], step['path_ms'], 4)}")


def format_critical_path(doc: dict[str, Any], rows: int = 5) -> str:
    """The text ``torchprof critical-path`` prints.

    Args:
        doc: :func:`~torchprof_args.analysis.critical_path.job_paths.critical_path`'s document as JSON
            values (docs/guides/critical-path.md).
        rows: operators and kernels listed.

    Returns:
        The text, without a final newline.
    """
    head = (f"torchprof critical-path: {doc['ranks']} rank{'s' if doc['ranks'] != 1 else ''}, step "
            f"{_ms(doc['step_ms'])}" + (f", {doc['cycle']}" if doc.get("cycle") else ""))
    lines = [head]
    clock = msgspec.convert(doc["clock"], ClockAlignment).line() if doc.get("clock") else None
    if clock:
        lines.append(f"  {clock}")
    for step in doc["steps"]:
        lines.append("  " + path_line(step))
        if len(step["by_rank"]) > 1:
            lines.append(f"    by rank: {_shares(step['by_rank'], step['path_ms'], 6)}")
        if step.get("by_phase"):
            lines.append(f"    by FSDP2 phase: {_shares(step['by_phase'], step['path_ms'], 5)}")
    if doc["top"]:
        lines.append("on the path, per step:")
        for entry in doc["top"][:rows]:
            site = f" at {entry['site']}" if entry.get("site") else ""
            category = entry["category"].replace("_", " ")
            lines.append(f"  {entry['ms_per_step']:8.2f} ms  rank {entry['rank']}  {category}"
                         f"  {entry['name'][:90]}{site}")
    for answer in doc.get("what_if") or []:
        lines.append(f"what if {answer['spec']}: step {_ms(answer['step_ms'])}, saves "
                     f"{_ms(answer['saving_ms_per_step'])}/step ({answer['how']})")
    lines += [f"  note: {note}" for note in doc.get("notes") or []]
    return "\n".join(lines)


#: a colour per category of the path (the report's strips).
CATEGORY_COLORS = {
    "compute_kernels": "#4e79a7", "communication": "#f28e2b", "launch_overhead": "#edc948",
    "host_sync": "#e15759", "data_loader": "#b07aa1", "waiting_for_rank": "#bab0ac", "cpu_only": "#76b7b2",
    "memory_copies": "#59a14f",
}
#: steps drawn in the report (the JSON has them all).
STRIP_STEPS = 4


def path_strip(step: dict[str, Any], width: int = 720) -> str:
    """One step's path as an SVG strip: a row per rank the path runs through, time across, each
    stretch coloured by its main category."""
    ranks = sorted({s["rank"] for s in step["segments"]})
    left, row_h, top = 70, 14, 22
    total = max(step["step_ms"], 1e-9)
    height = top + row_h * len(ranks) + 26
    name = html.escape(step["step"])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 10}" height="{height}" '
           'font-size="11">',
           f'<text x="4" y="14" font-weight="bold">{name}: {step["step_ms"]:.1f} ms, path '
           f'{step["path_ms"]:.1f} ms (reference rank {step["rank"]})</text>']
    row = {r: i for i, r in enumerate(ranks)}
    for r in ranks:
        out.append(f'<text x="4" y="{top + row[r] * row_h + 11}">rank {r}</text>')
    for s in step["segments"]:
        x = left + width * s["start_ms"] / total
        w = max(width * (s["end_ms"] - s["start_ms"]) / total, 0.5)
        color = CATEGORY_COLORS.get(s["category"], "#999999")
        y = top + row[s["rank"]] * row_h
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 2}" fill="{color}">'
                   f'<title>rank {s["rank"]}: {s["start_ms"]:.2f}-{s["end_ms"]:.2f} ms, '
                   f'{s["category"].replace("_", " ")}</title></rect>')
    lx, ly = left, height - 6
    for name in dict.fromkeys(s["category"] for s in step["segments"]):
        fill = CATEGORY_COLORS.get(name, "#999")
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{fill}"/>'
                   f'<text x="{lx + 14}" y="{ly}">{html.escape(name.replace("_", " "))}</text>')
        lx += 14 + 7 * len(name) + 12
    out.append("</svg>")
    return "\n".join(out)


def path_section(doc: dict[str, Any] | None) -> str:
    """The report's critical-path section of one cycle: each step's strip (the first
    :data:`STRIP_STEPS`), its time by category, the top of the path."""
    if doc is None or not doc.get("steps"):
        return ""
    parts = ["<h3>Critical path (torchprof critical-path)</h3>",
             "<p>Per step, the chain of dependencies that set its length, rank by rank "
             "(hover a stretch).</p>"]
    parts += [path_strip(step) for step in doc["steps"][:STRIP_STEPS]]
    if doc["top"]:
        rows = "".join(f"<tr><td>{t['ms_per_step']:.2f}</td><td>{t['rank']}</td>"
                       f"<td>{html.escape(t['category'].replace('_', ' '))}</td>"
                       f"<td>{html.escape(t['name'][:100])}</td>"
                       f"<td>{html.escape(t.get('site') or '')}</td></tr>" for t in doc["top"][:10])
        parts.append("<table><tr><th>ms / step</th><th>rank</th><th>category</th><th>on the path</th>"
                     f"<th>call site</th></tr>{rows}</table>")
    parts += [f"<p>{html.escape(note)}</p>" for note in doc.get("notes") or []]
    return "\n".join(parts)
