"""The one rank x interval heatmap (inline SVG): which rank is slow, and since when.

Drawn by ``torchprof dashboard`` (the step timers' straggler scores and the GPUs' readings, per log
interval) and ``torchprof report`` (each rank's step time per profiled step).  Each cell is a rank's
value over a reference (``against``): a straggler score already (``"score"``), over the median of
the other ranks (``"others"``, :mod:`.stragglers`' rule), or over the median of all (``"median"``).
White is 1, red slower (dark red at ``span``x), blue faster (dark blue at ``1/span``x), grey missing.

Bounded for large jobs: ranks and intervals beyond the :class:`Layout`'s ``max_rows`` /
``max_columns`` fold into buckets that show their largest value (the slowest rank of a bucket is
what a reader looks for); a row is at least one pixel high; past :data:`MAX_CELL_TITLES` cells
each row has one tooltip listing its values instead of one per cell.  No numpy, like all of
``shared/`` (the foundation layer, imported by both sides).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from torchprof_args.shared.stragglers import others_medians

__all__ = ["MAX_CELL_TITLES", "Against", "Column", "Grid", "Layout", "grid", "heatmap_svg"]

#: above this many cells a heatmap has one tooltip per row instead of one per cell.
MAX_CELL_TITLES = 6000
#: a column: its label and every rank's value (None or non-finite: no reading).
Column = tuple[str, Sequence[float | None]]
#: what 1.0 is: the values are scores already, or each over its column's median (all or other ranks).
Against = Literal["score", "median", "others"]
_REFERENCE = {"score": "the other ranks' median", "median": "the median", "others": "the other ranks' median"}
_WHITE, _SLOW, _FAST, _MISSING = (255, 255, 255), (0xB2, 0x18, 0x2B), (0x21, 0x66, 0xAC), "#dddddd"
_LEFT, _TOP, _RIGHT, _BOTTOM = 62, 34, 14, 62


@dataclass(frozen=True)
class Layout:
    """The plot's bounds in pixels (cells shrink to fit, at most 80 x 14 each, rows at least 1
    high) and the most rows and columns drawn before folding into buckets."""

    width: float
    height: float
    max_rows: int
    max_columns: int


@dataclass(frozen=True)
class Grid:
    """What is drawn: row and column labels, and per cell (ratio, value) or None (no reading)."""

    rows: list[str]
    columns: list[str]
    cells: list[list[tuple[float, float] | None]]


def _median(values: list[float]) -> float:
    ranked, half = sorted(values), len(values) // 2
    return ranked[half] if len(ranked) % 2 else (ranked[half - 1] + ranked[half]) / 2


def _ratios(values: Sequence[float | None], against: Against) -> list[tuple[float, float] | None]:
    """Each value as (ratio, value); None where missing or its reference is not positive."""
    present = [(i, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    known = [v for _, v in present]
    if against == "score":
        refs = [1.0] * len(known)
    elif against == "others" and len(known) > 1:
        refs = others_medians(known)
    else:  # the median of all (a lone value is its own reference)
        refs = [_median(known)] * len(known) if known else []
    out: list[tuple[float, float] | None] = [None] * len(values)
    for (i, v), ref in zip(present, refs, strict=True):
        out[i] = (v / ref, v) if ref > 0 else None
    return out


def _buckets(count: int, limit: int) -> list[range]:
    size = max(1, math.ceil(count / limit))
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def grid(columns: Sequence[Column], against: Against, layout: Layout,
         ranks: Sequence[int] | None = None) -> Grid:
    """The cells of ``columns`` (rows: ``ranks``, default 0..n-1), each the largest ratio of its
    bucket of at most ``layout.max_rows`` x ``layout.max_columns``."""
    ratios = [_ratios(values, against) for _, values in columns]
    n_ranks = max((len(values) for _, values in columns), default=0)
    ranks = list(ranks) if ranks is not None else list(range(n_ranks))
    row_buckets, col_buckets = _buckets(n_ranks, layout.max_rows), _buckets(len(columns), layout.max_columns)

    def largest(rows: range, cols: range) -> tuple[float, float] | None:
        found = [cell for c in cols for r in rows if r < len(ratios[c]) and (cell := ratios[c][r])]
        return max(found) if found else None

    return Grid([f"{ranks[b[0]]}" if len(b) == 1 else f"{ranks[b[0]]}-{ranks[b[-1]]}" for b in row_buckets],
                [columns[b[-1]][0] for b in col_buckets],
                [[largest(rows, cols) for cols in col_buckets] for rows in row_buckets])


def _color(t: float) -> str:
    """``t`` in -1 (dark blue) .. 0 (white) .. 1 (dark red)."""
    target, t = (_SLOW, min(t, 1.0)) if t >= 0 else (_FAST, min(-t, 1.0))
    return "#" + "".join(f"{round(w + (c - w) * t):02x}" for w, c in zip(_WHITE, target, strict=True))


def _fill(cell: tuple[float, float] | None, span: float) -> str:
    """Linear from white at 1 to dark red at ``span`` and to dark blue at ``1 / span``."""
    if cell is None:
        return _MISSING
    return _color((cell[0] - 1) / (span - 1) if cell[0] >= 1 else (cell[0] - 1) / (1 - 1 / span))


def _span(cells: list[list[tuple[float, float] | None]]) -> float:
    """1 + the 99th percentile of the cells' distance from 1 (at least 1.01)."""
    devs = sorted(abs(cell[0] - 1.0) for line in cells for cell in line if cell)
    return 1.0 + max(devs[min(len(devs) - 1, int(0.99 * len(devs)))] if devs else 0.0, 0.01)


def heatmap_svg(title: str, columns: Sequence[Column], layout: Layout, *, against: Against = "score",
                x_name: str = "iteration", ranks: Sequence[int] | None = None,
                fmt: Callable[[float], str] | None = None, span: float | None = None) -> str:
    """``columns`` (one per interval: every rank's value) as one heatmap; ``fmt`` shows the values
    beside their ratios in tooltips; ``span``: the ratio drawn darkest red (default: fitted, 1 +
    the 99th percentile of the distances from 1, at least 1.01)."""
    g, esc, reference = grid(columns, against, layout, ranks), html.escape, _REFERENCE[against]
    span = span or _span(g.cells)
    n_rows, n_cols = len(g.rows), len(g.columns)
    cell_w = min(80.0, layout.width / max(n_cols, 1))
    cell_h = max(1.0, min(14.0, layout.height / max(n_rows, 1)))
    plot_w, plot_h = cell_w * n_cols, cell_h * n_rows
    width, height = max(_LEFT + plot_w + _RIGHT, 7 * len(title) + 20), _TOP + plot_h + _BOTTOM
    out = [f'<svg class="panel heatmap" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height:.0f}" font-size="11" role="img" aria-label="{esc(title)}">',
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
           f'<text x="4" y="20" font-size="13" font-weight="bold" class="title">{esc(title)}</text>']

    def shown(cell: tuple[float, float]) -> str:
        return (f"{fmt(cell[1])}, " if fmt else "") + f"{cell[0]:.2f}x"

    titled = n_rows * n_cols <= MAX_CELL_TITLES
    size = f'width="{cell_w + 0.05:.4g}" height="{cell_h + 0.05:.4g}"'  # a hair more: no seams
    for i, (label, line) in enumerate(zip(g.rows, g.cells, strict=True)):
        y = round(_TOP + i * cell_h, 2)
        out.append("<g>" if titled else f"<g><title>rank {esc(label)}: " + ", ".join(
            f"{esc(c)} {shown(cell)}" for c, cell in zip(g.columns, line, strict=True) if cell) + "</title>")
        for j, cell in enumerate(line):
            rect = f'<rect x="{round(_LEFT + j * cell_w, 2):g}" y="{y:g}" {size} fill="{_fill(cell, span)}"'
            text = shown(cell) if cell else "no reading"
            where = f"rank {esc(label)}, {esc(x_name)} {esc(g.columns[j])}"
            out.append(f"{rect}><title>{where}: {text}</title></rect>" if titled else rect + "/>")
        out.append("</g>")
    base, middle = _TOP + plot_h, _TOP + plot_h / 2
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w:g}" height="{plot_h:g}" fill="none" '
               'stroke="#bbb"/>')
    out += [f'<text x="{_LEFT - 6}" y="{_TOP + (i + 0.5) * cell_h + 4:.1f}" text-anchor="end">'
            f"{esc(g.rows[i])}</text>" for i in range(0, n_rows, math.ceil(13 / cell_h))]
    out += [f'<text x="{_LEFT + (j + 0.5) * cell_w:.1f}" y="{base + 15:.1f}" text-anchor="middle">'
            f"{esc(g.columns[j])}</text>" for j in range(0, n_cols, math.ceil(50 / cell_w))]
    out.append(f'<text x="{_LEFT + plot_w / 2:.1f}" y="{base + 30:.1f}" text-anchor="middle">'
               f'{esc(x_name)}</text><text x="14" y="{middle:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {middle:.1f})">rank</text>')
    out.append(_legend(base + 40, span, reference))
    out.append("</svg>")
    return "\n".join(out)


def _legend(y: float, span: float, reference: str) -> str:
    """``1/span x``, seven swatches from dark blue to dark red, ``span x+`` and what white is."""
    swatches = "".join(f'<rect x="{_LEFT + 34 + k * 14}" y="{y:.0f}" width="14" height="9" '
                       f'fill="{_color(k / 3 - 1)}" stroke="#bbb" stroke-width="0.5"/>' for k in range(7))
    return (f'<text x="{_LEFT}" y="{y + 9:.0f}">{1 / span:.3g}x</text>{swatches}'
            f'<text x="{_LEFT + 136}" y="{y + 9:.0f}">{span:.3g}x+ (white: {reference})</text>')
