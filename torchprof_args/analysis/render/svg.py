"""Inline SVG charts for the HTML report: histogram, stacked bars (no scripts, no network).  The
rank x step heatmap is the one the dashboard draws too: :mod:`torchprof_args.shared.heatmap`."""

from __future__ import annotations

import html
import math
from collections.abc import Callable

import numpy as np

__all__ = ["COLORS", "histogram", "stacked_bars"]

COLORS = {
    "computation": "#4e79a7",
    "communication": "#f28e2b",
    "memory": "#59a14f",
    "overlap": "#b07aa1",
    "idle": "#bab0ac",
    "bar": "#4e79a7",
}


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def histogram(title: str, values: list[float | None], fmt: Callable[[float], str], bins: int = 30) -> str:
    """Counts of ``values`` (None and non-finite ones left out) in ``bins`` equal-width bins, with the
    min / median / max marked."""
    data = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    width, height, left, top, plot_h = 380, 190, 36, 26, 120
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">',
           f'<text x="4" y="16" font-weight="bold">{_esc(title)}</text>']
    if len(data) == 0:
        out.append(f'<text x="{left}" y="{top + 40}">no data</text></svg>')
        return "\n".join(out)
    lo, hi = float(data.min()), float(data.max())
    if hi <= lo:
        hi = lo + max(abs(lo) * 1e-3, 1e-9)
    counts, edges = np.histogram(data, bins=bins, range=(lo, hi))
    bar_w = (width - left - 10) / bins
    cmax = int(counts.max())
    for i, c in enumerate(counts):
        if c == 0:
            continue
        h = plot_h * c / cmax
        out.append(f'<rect x="{left + i * bar_w:.1f}" y="{top + plot_h - h:.1f}" '
                   f'width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}" fill="{COLORS["bar"]}">'
                   f'<title>{int(c)} rank(s): {fmt(edges[i])} - {fmt(edges[i + 1])}</title></rect>')
    out.append(f'<text x="{left - 4}" y="{top + 9}" text-anchor="end">{cmax}</text>')
    axis = top + plot_h + 14
    out.append(f'<text x="{left}" y="{axis}">{_esc(fmt(lo))}</text>')
    out.append(f'<text x="{width - 10}" y="{axis}" text-anchor="end">{_esc(fmt(hi))}</text>')
    median = _esc(fmt(float(np.median(data))))
    out.append(f'<text x="{left}" y="{axis + 16}">{len(data)} ranks, median {median}</text>')
    out.append("</svg>")
    return "\n".join(out)


def stacked_bars(title: str, rows: list[tuple[str, dict[str, float]]], unit: str) -> str:
    """One horizontal bar per row, its series stacked (colours from :data:`COLORS`)."""
    left, bar_w, row_h = 150, 520, 24
    series = list(dict.fromkeys(name for _, parts in rows for name in parts))
    vmax = max([sum(parts.values()) for _, parts in rows] + [1e-12])
    height = 30 + row_h * len(rows) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + bar_w + 120}" height="{height}" '
           'font-size="11">',
           f'<text x="4" y="16" font-weight="bold">{_esc(title)}</text>']
    for i, (label, parts) in enumerate(rows):
        y, x = 28 + i * row_h, float(left)
        out.append(f'<text x="4" y="{y + 13}">{_esc(label)}</text>')
        for name in series:
            w = bar_w * parts.get(name, 0.0) / vmax
            if w > 0:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" '
                           f'fill="{COLORS.get(name, "#76b7b2")}">'
                           f'<title>{_esc(name)}: {parts[name]:,.2f} {unit}</title></rect>')
                x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{sum(parts.values()):,.2f} {unit}</text>')
    lx, ly = left, height - 12
    for name in series:
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" '
                   f'fill="{COLORS.get(name, "#76b7b2")}"/><text x="{lx + 14}" y="{ly}">{_esc(name)}</text>')
        lx += 14 + 7 * len(name) + 16
    out.append("</svg>")
    return "\n".join(out)
