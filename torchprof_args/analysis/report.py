"""Self-contained HTML report (inline SVG, no scripts, no network) for a directory of rank traces."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from torchprof_args.atomic import write_text_atomically

_COLORS = {
    "computation": "#4e79a7",
    "communication": "#f28e2b",
    "memory": "#59a14f",
    "overlap": "#b07aa1",
    "idle": "#bab0ac",
    "step": "#4e79a7",
    "slow": "#e15759",
}


def _bars(title: str, labels: list[str], series: dict[str, list[float]], unit: str, stacked: bool = True,
          highlight: int | None = None) -> str:
    """A horizontal bar chart as SVG: one row per label, series stacked or side by side."""
    row_h = 22 if stacked else 12 * max(len(series), 1) + 8
    left, width = 90, 560
    height = 40 + row_h * len(labels) + 30
    totals = [sum(vals[i] for vals in series.values()) if stacked else max((vals[i] for vals in series.values()), default=0)
              for i in range(len(labels))]
    vmax = max(totals + [1e-9])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 120}" height="{height}" role="img">',
           f'<text x="4" y="16" font-weight="bold">{html.escape(title)}</text>']
    for i, label in enumerate(labels):
        y = 30 + i * row_h
        out.append(f'<text x="4" y="{y + 14}" font-size="12">{html.escape(label)}</text>')
        x = left
        for k, (name, vals) in enumerate(series.items()):
            w = width * vals[i] / vmax
            color = _COLORS.get(name, "#76b7b2")
            if highlight is not None and i == highlight and len(series) == 1:
                color = _COLORS["slow"]
            if stacked:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" fill="{color}"><title>{html.escape(name)}: {vals[i]:,.1f} {unit}</title></rect>')
                x += w
            else:
                yy = y + k * 12
                out.append(f'<rect x="{left}" y="{yy}" width="{w:.1f}" height="10" fill="{color}"><title>{html.escape(name)}: {vals[i]:,.2f} {unit}</title></rect>')
                out.append(f'<text x="{left + w + 4:.1f}" y="{yy + 9}" font-size="10">{vals[i]:,.1f}</text>')
        if stacked:
            out.append(f'<text x="{x + 4:.1f}" y="{y + 13}" font-size="11">{totals[i]:,.1f} {unit}</text>')
    ly = height - 12
    lx = left
    for name in series:
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{_COLORS.get(name, "#76b7b2")}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}" font-size="11">{html.escape(name)}</text>')
        lx += 14 + 8 * len(name) + 16
    out.append("</svg>")
    return "\n".join(out)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_report(summaries: list[dict[str, Any]], view: dict[str, Any]) -> str:
    """The HTML page for per-rank summaries and their :func:`cross_rank` view."""
    ranked = sorted(zip(summaries, view["ranks"], strict=False), key=lambda p: p[1]["rank"])
    labels = [f"rank {r['rank']}" for _, r in ranked]
    ms = [(r["step_mean_us"] or 0) / 1e3 for _, r in ranked]
    slow_index = next((i for i, (_, r) in enumerate(ranked) if r["rank"] == view.get("slowest_rank")), None)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>torchprof report</title>",
        "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}h2{margin-top:28px}svg{display:block;margin:8px 0}</style>",
        "</head><body><h1>torchprof trace report</h1>",
        f"<p>{len(summaries)} rank trace(s). GPU numbers use Holistic Trace Analysis definitions.</p>",
        "<h2>Step time per rank</h2>",
        _bars("Mean ProfilerStep time (ms); slowest rank in red", labels, {"step": ms}, "ms", highlight=slow_index),
    ]
    if view.get("slowest_rank") is not None:
        parts.append(
            f"<p>Slowest rank: <b>{view['slowest_rank']}</b>, fastest: {view['fastest_rank']}, "
            f"spread {view['spread_pct']:.2f}% of the mean step ({view['step_mean_us'] / 1e3:,.2f} ms).</p>"
        )
    gpus = [s["gpu"] for s, _ in ranked]
    if any(g is not None for g in gpus):
        kinds = ["computation", "communication", "memory"]
        series = {k: [(g or {}).get("kernel_type_us", {}).get(k, 0) / 1e3 for g in gpus] for k in kinds}
        series["overlap"] = [sum((g or {}).get("kernel_type_overlapping_us", {}).values()) / 1e3 for g in gpus]
        parts += ["<h2>Kernel-type breakdown</h2>",
                  _bars("GPU kernel time by class, exclusive (ms)", labels, series, "ms")]
        parts += ["<h2>Idle and overlap</h2>",
                  _bars("GPU idle % of kernel-active span / comm-comp overlap %", labels,
                        {"idle": [(g or {}).get("idle_pct") or 0 for g in gpus],
                         "overlap": [(g or {}).get("comm_comp_overlap_pct") or 0 for g in gpus]}, "%", stacked=False)]
        first = ranked[0][0]
        parts += [f"<h2>Top kernels (rank {ranked[0][1]['rank']})</h2>",
                  _table(["kernel", "type", "calls", "total ms", "% of kernel time"],
                         [[k["name"][:120], k["type"], k["calls"], f"{k['total_us'] / 1e3:,.3f}", f"{k['pct']:.2f}"]
                          for k in first["top_kernels"][:15]])]
    mean = view.get("step_mean_us") or 0
    stragglers = [r for _, r in ranked if r["step_mean_us"] and mean and r["step_mean_us"] > 1.05 * mean]
    parts.append("<h2>Stragglers</h2>")
    if stragglers:
        parts.append(_table(["rank", "mean step ms", "vs mean"],
                            [[r["rank"], f"{r['step_mean_us'] / 1e3:,.2f}", f"+{100 * (r['step_mean_us'] / mean - 1):.1f}%"] for r in stragglers]))
    else:
        parts.append("<p>No rank is more than 5% slower than the mean step.</p>")
    parts.append("<h2>Per-rank details</h2>")
    parts.append(_table(["rank", "file", "steps", "mean step ms", "GPU idle %", "compute %", "overlap %"],
                        [[r["rank"], Path(r["file"]).name, r["steps"], f"{(r['step_mean_us'] or 0) / 1e3:,.2f}",
                          "-" if s["gpu"] is None else f"{s['gpu']['idle_pct']:.2f}",
                          "-" if s["gpu"] is None else f"{s['gpu']['compute_pct']:.2f}",
                          "-" if not s["gpu"] or s["gpu"]["comm_comp_overlap_pct"] is None else f"{s['gpu']['comm_comp_overlap_pct']:.2f}"]
                         for s, r in ranked]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(summaries: list[dict[str, Any]], view: dict[str, Any], output: str | Path) -> Path:
    """Publish :func:`render_report`'s page at ``output`` (atomically); returns its path."""
    output = Path(output)
    write_text_atomically(output, render_report(summaries, view))
    return output
