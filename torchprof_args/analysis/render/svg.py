"""Inline SVG charts for the HTML report: heatmap, histogram, stacked bars (no scripts, no network).

Sized for many ranks: a heatmap row may be one pixel high (1,024 ranks stay on one screen),
labels thin out, and per-cell tooltips are dropped past :data:`MAX_CELL_TITLES` cells so a report
for a large job stays a few MB.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

import numpy as np

__all__ = ["COLORS", "MAX_CELL_TITLES", "heatmap", "histogram", "stacked_bars"]

COLORS = {
    "computation": "#4e79a7",
    "communication": "#f28e2b",
    "memory": "#59a14f",
    "overlap": "#b07aa1",
    "idle": "#bab0ac",
    "bar": "#4e79a7",
}
#: above this many cells a heatmap has one tooltip per row instead of one per cell.
MAX_CELL_TITLES = 12_000
_FAST, _MID, _SLOW, _MISSING = (33, 102, 172), (247, 247, 247), (178, 24, 43), "#dddddd"


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


def _diverging(rel: float, scale: float) -> str:
    """Blue (faster than the reference) - white - red (slower), saturating at +-``scale``."""
    t = max(-1.0, min(1.0, rel / scale))
    return _mix(_MID, _SLOW, t) if t >= 0 else _mix(_MID, _FAST, -t)


def heatmap(title: str, row_labels: list[str], col_labels: list[str], values: np.ndarray,
            fmt: Callable[[float], str]) -> str:
    """Rows x columns of ``values`` (NaN: missing), each cell coloured by its deviation from its
    column's median (a step that is long on every rank is not a straggler)."""
    n_rows, n_cols = values.shape
    cell_h = max(1.0, min(14.0, 900.0 / max(n_rows, 1)))
    cell_w = max(6.0, min(80.0, 900.0 / max(n_cols, 1)))
    left, top = 90, 34
    width = max(left + cell_w * n_cols + 170, 7 * len(title) + 20)
    height = top + cell_h * n_rows + 60
    with np.errstate(all="ignore"):
        reference = np.nanmedian(values, axis=0) if n_rows else np.zeros(n_cols)
        rel = values / reference - 1.0
    finite = np.abs(rel[np.isfinite(rel)])
    scale = max(float(np.percentile(finite, 99)) if len(finite) else 0.0, 0.01)
    titles = n_rows * n_cols <= MAX_CELL_TITLES
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           'font-size="11">',
           f'<text x="4" y="16" font-weight="bold" font-size="13">{_esc(title)}</text>']
    every = max(1, math.ceil(13.0 / cell_h))
    for i, label in enumerate(row_labels):
        y = top + i * cell_h
        row = [f'<g><title>{_esc(label)}: ' + ", ".join(
            f"{_esc(c)} {fmt(v)}" for c, v in zip(col_labels, values[i], strict=True) if np.isfinite(v))
            + "</title>"] if not titles else ["<g>"]
        for j in range(n_cols):
            v = values[i, j]
            fill = _diverging(float(rel[i, j]), scale) if np.isfinite(v) else _MISSING
            tip = (f"<title>{_esc(label)} {_esc(col_labels[j])}: {fmt(v)} ({100 * rel[i, j]:+.1f}%)</title>"
                   if titles and np.isfinite(v) else "")
            row.append(f'<rect x="{left + j * cell_w:.1f}" y="{y:.1f}" width="{cell_w:.1f}" '
                       f'height="{cell_h:.2f}" fill="{fill}">{tip}</rect>')
        out.append("".join(row) + "</g>")
        if i % every == 0:
            out.append(f'<text x="{left - 4}" y="{y + min(cell_h, 11):.1f}" text-anchor="end">'
                       f'{_esc(label)}</text>')
    col_every = max(1, math.ceil(70.0 / cell_w))
    base = top + cell_h * n_rows + 14
    for j in range(0, n_cols, col_every):
        out.append(f'<text x="{left + j * cell_w:.1f}" y="{base:.1f}">{_esc(col_labels[j])}</text>')
    out.append(_legend(left + cell_w * n_cols + 16, top, scale))
    out.append("</svg>")
    return "\n".join(out)


def _legend(x: float, y: float, scale: float) -> str:
    parts = []
    for k in range(21):
        t = 1.0 - k / 10.0
        parts.append(f'<rect x="{x:.0f}" y="{y + k * 8:.0f}" width="14" height="8" '
                     f'fill="{_diverging(t * scale, scale)}"/>')
    for t, label in ((1.0, f"+{100 * scale:.1f}% (slower)"), (0.0, "the step's median"),
                     (-1.0, f"-{100 * scale:.1f}% (faster)")):
        parts.append(f'<text x="{x + 18:.0f}" y="{y + (1.0 - t) * 80 + 8:.0f}">{_esc(label)}</text>')
    return "".join(parts)


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
