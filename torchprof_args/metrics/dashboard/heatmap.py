"""The dashboard's rank x interval heatmap (inline SVG): which rank is slow, and since when.

Each cell is one rank's straggler score (its time over the median of the other ranks) in one log
interval, from the per-rank series of ``metrics.jsonl``.  White is the median, red slower (dark
red at 2x and above), blue faster.  Large jobs are drawn at a bounded size: intervals and ranks
beyond :data:`MAX_COLUMNS` / :data:`MAX_ROWS` are folded into buckets that show their maximum
(the slowest rank of a bucket is what a reader looks for).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_COLUMNS", "MAX_ROWS", "heatmap_grid", "heatmap_svg"]

MAX_COLUMNS = 240
MAX_ROWS = 128
#: Cells that get a hover title (a bigger page loads slowly).
MAX_TITLED_CELLS = 6000

Grid = tuple[list[float], list[str], list[list[float | None]]]


def _buckets(count: int, limit: int) -> list[range]:
    size = max(1, math.ceil(count / limit))
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def _bucket_max(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return max(present) if present else None


def _over_median(values: list[float | None]) -> list[float | None]:
    present = sorted(v for v in values if v is not None and math.isfinite(v))
    if not present:
        return values
    middle = len(present) // 2
    median = present[middle] if len(present) % 2 else (present[middle - 1] + present[middle]) / 2
    return [None if v is None or median <= 0 else v / median for v in values]


def heatmap_grid(records: Sequence[Mapping[str, Any]], key: str, x_key: str = "iteration",
                 relative: bool = False) -> Grid | None:
    """``(x values, row labels, cells[row][column])`` of the per-rank series ``key``, folded to at
    most MAX_ROWS x MAX_COLUMNS; None when no record has it.  ``relative``: each interval's values
    over their median across ranks (raw readings such as SM clock or power)."""
    columns = [(record[x_key], record.get("per_rank", {}).get(key)) for record in records]
    columns = [(x, _over_median(values) if relative else values) for x, values in columns
               if isinstance(values, list) and values]
    if not columns:
        return None
    ranks = max(len(values) for _, values in columns)
    col_buckets = _buckets(len(columns), MAX_COLUMNS)
    row_buckets = _buckets(ranks, MAX_ROWS)
    xs = [float(columns[bucket[-1]][0]) for bucket in col_buckets]
    labels = [f"{rows[0]}" if len(rows) == 1 else f"{rows[0]}-{rows[-1]}" for rows in row_buckets]
    cells: list[list[float | None]] = []
    for rows in row_buckets:
        line = []
        for bucket in col_buckets:
            line.append(_bucket_max([columns[c][1][r] if r < len(columns[c][1]) else None
                                     for c in bucket for r in rows]))
        cells.append(line)
    return xs, labels, cells


def _color(value: float | None) -> str:
    """White at 1 (the median), to red at 2x, to blue at 0.5x; grey when the rank had no reading."""
    if value is None:
        return "#e6e6e6"
    if value >= 1.0:
        t = min(1.0, value - 1.0)
        target = (0xB2, 0x18, 0x2B)
    else:
        t = min(1.0, (1.0 - value) * 2.0)
        target = (0x21, 0x66, 0xAC)
    r, g, b = (round(255 + (c - 255) * t) for c in target)
    return f"#{r:02x}{g:02x}{b:02x}"


def _tick_indices(count: int, most: int) -> list[int]:
    shown = min(count, most)
    return sorted({round(i * (count - 1) / max(1, shown - 1)) for i in range(shown)})


def _axes(
    left: float, top: float, width: float, height: float, xs: list[float], labels: list[str]
) -> list[str]:
    out = [f'<rect x="{left}" y="{top}" width="{width}" height="{height}" class="frame"/>']
    cell_w, cell_h = width / len(xs), height / len(labels)
    for index in _tick_indices(len(xs), 6):
        x = left + (index + 0.5) * cell_w
        out.append(f'<text x="{x:.1f}" y="{top + height + 15}" class="tick" '
                   f'text-anchor="middle">{xs[index]:g}</text>')
    for index in _tick_indices(len(labels), 8):
        y = top + (index + 0.5) * cell_h + 4
        out.append(f'<text x="{left - 6}" y="{y:.1f}" class="tick" '
                   f'text-anchor="end">{html.escape(labels[index])}</text>')
    out.append(f'<text x="{left + width / 2:.1f}" y="{top + height + 30}" class="axislabel" '
               'text-anchor="middle">iteration</text>')
    out.append(f'<text x="14" y="{top + height / 2:.1f}" class="axislabel" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + height / 2:.1f})">rank</text>')
    return out


def _legend(left: float, y: float) -> list[str]:
    out = []
    stops = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    for index, value in enumerate(stops):
        out.append(f'<rect x="{left + index * 22}" y="{y}" width="22" height="9" fill="{_color(value)}" '
                   'stroke="#bbb" stroke-width="0.5"/>')
    out.append(f'<text x="{left}" y="{y + 20}" class="legend">0.5x</text>')
    out.append(f'<text x="{left + 3 * 22 + 11}" y="{y + 20}" class="legend" '
               'text-anchor="middle">median</text>')
    out.append(f'<text x="{left + 7 * 22}" y="{y + 20}" class="legend" text-anchor="end">2x+</text>')
    return out


def heatmap_svg(
    title: str, unit: str, xs: list[float], labels: list[str], cells: list[list[float | None]]
) -> str:
    """One heatmap panel as an inline SVG (same frame and classes as the line panels)."""
    width, height, left, top, right, bottom = 420, 270, 62, 34, 14, 62
    plot_w, plot_h = width - left - right, height - top - bottom
    out = [
        f'<svg class="panel heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="20" class="title">{html.escape(title)} '
        f'<tspan class="unit">({html.escape(unit)}, per rank)</tspan></text>',
    ]
    cell_w, cell_h = plot_w / len(xs), plot_h / len(labels)
    titled = len(xs) * len(labels) <= MAX_TITLED_CELLS
    for row, line in enumerate(cells):
        for column, value in enumerate(line):
            rect = (f'<rect class="cell" x="{left + column * cell_w:.2f}" y="{top + row * cell_h:.2f}" '
                    f'width="{cell_w + 0.05:.2f}" height="{cell_h + 0.05:.2f}" fill="{_color(value)}"')
            if titled:
                shown = "no reading" if value is None else f"{value:.2f}x the median"
                rect += (f"><title>rank {html.escape(labels[row])}, iteration {xs[column]:g}: "
                         f"{shown}</title></rect>")
            else:
                rect += "/>"
            out.append(rect)
    out += _axes(left, top, plot_w, plot_h, xs, labels)
    out += _legend(left + plot_w - 7 * 22, height - 22)
    out.append("</svg>")
    return "\n".join(out)
