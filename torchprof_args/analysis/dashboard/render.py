"""The step-timing dashboard: one panel spec, rendered as a self-contained HTML page (SVG plots).

One panel specification (:data:`DEFAULT_SPEC`, also shipped as ``configs/wandb_dashboard.json``)
drives both renderings, so the HTML page and the wandb workspace show the same panels: iteration
time, each timer's min/max across ranks, a rank x iteration heatmap of the straggler scores,
throughput, memory and the profiler's own figures, all against the training iteration.

The same spec becomes a wandb workspace view in :mod:`~torchprof_args.analysis.dashboard.wandb_view`
(``torchprof dashboard``).
"""

from __future__ import annotations

import copy
import dataclasses
import html
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchprof_args.analysis.dashboard.spec import DEFAULT_SPEC
from torchprof_args.shared.heatmap import Layout, heatmap_svg
from torchprof_args.shared.metrics_log import MetricsRecord

__all__ = [
    "DEFAULT_SPEC",
    "Panel",
    "expand_panels",
    "load_spec",
    "render_html",
]

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
#: a heatmap panel as wide as a line panel; ranks folded to 128 rows, intervals to 240 columns.
_HEATMAP = Layout(width=344, height=174, max_rows=128, max_columns=240)


class Panel:
    """One expanded panel: a title, a unit and the metric keys it plots.

    ``kind`` is ``"line"`` or ``"heatmap"``; a heatmap draws the records' per-rank series
    ``per_rank`` (rank x iteration) in HTML, and its ``keys`` as lines in wandb.
    """

    def __init__(
        self, title: str, unit: str, keys: list[str], labels: list[str], band: bool, regex: str | None = None,
        kind: str = "line", per_rank: str | None = None, relative: bool = False,
    ) -> None:
        self.title = title
        self.unit = unit
        self.keys = keys
        self.labels = labels
        self.band = band
        #: For wandb when the keys are not known yet: plot every metric matching this.
        self.regex = regex
        self.kind = kind
        self.per_rank = per_rank
        #: a heatmap of raw readings (clock, power ...): each over its interval's median across ranks
        self.relative = relative

    def __repr__(self) -> str:
        return f"Panel({self.title!r}, {self.keys!r})"


def load_spec(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The panel spec from ``path`` (JSON), else :data:`DEFAULT_SPEC`."""
    if path is None:
        return copy.deepcopy(DEFAULT_SPEC)
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"dashboard spec {path}: cannot be read as JSON ({err}).") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("sections"), list):
        raise ValueError(f"dashboard spec {path}: expected an object with a 'sections' list.")
    return spec


def _pattern_regex(pattern: str) -> str:
    head, _, tail = pattern.partition("{name}")
    return f"^{re.escape(head)}(?P<name>.+){re.escape(tail)}$"


def expand_panels(spec: Mapping[str, Any], keys: Sequence[str] | None) -> list[tuple[str, list[Panel]]]:
    """``[(section name, panels)]`` for the metric ``keys`` present (``None``: keys unknown,
    ``for_each`` panels become one regex panel each).  Panels without data are dropped."""
    present = None if keys is None else set(keys)
    sections: list[tuple[str, list[Panel]]] = []
    for section in spec.get("sections", []):
        panels: list[Panel] = []
        for entry in section.get("panels", []):
            unit = entry.get("unit", "")
            band = bool(entry.get("band", False))
            templates = list(entry.get("y", []))
            labels = list(entry.get("labels", []))
            pattern = entry.get("for_each")
            if pattern is None:
                shown = [k for k in templates if present is None or k in present]
                if shown:
                    shown_labels = [
                        labels[templates.index(k)] if templates.index(k) < len(labels) else k for k in shown
                    ]
                    panels.append(Panel(entry.get("title", shown[0]), unit, shown, shown_labels,
                                        band and len(shown) == 2, kind=entry.get("kind", "line"),
                                        per_rank=entry.get("per_rank"), relative=bool(entry.get("relative"))))
                continue
            regex = _pattern_regex(pattern)
            if present is None:
                title = entry.get("title", "{name}").replace("{name}", "all")
                panels.append(Panel(title, unit, [], [], False, regex=regex))
                continue
            skip = entry.get("skip")
            names = []
            for key in sorted(present):
                match = re.match(regex, key)
                if match and not (skip and re.search(skip, match["name"])):
                    names.append(match["name"])
            kind, per_rank = entry.get("kind", "line"), entry.get("per_rank")
            for name in names:
                shown = [t.replace("{name}", name) for t in templates]
                keep = [i for i, k in enumerate(shown) if k in present]
                panels.append(
                    Panel(
                        entry.get("title", "{name}").replace("{name}", name),
                        unit,
                        [shown[i] for i in keep],
                        [labels[i] if i < len(labels) else shown[i] for i in keep],
                        band and len(keep) == 2,
                        kind=kind,
                        per_rank=per_rank.replace("{name}", name) if per_rank else None,
                    )
                )
        if panels:
            sections.append((section.get("name", ""), panels))
    return sections


# ---------------------------------------------------------------------------------------------
# HTML rendering (inline SVG, no network)


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high <= low:
        high = low + (abs(low) * 0.1 or 1.0)
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def _fmt(value: float) -> str:
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _scale_unit(unit: str, peak: float) -> tuple[str, float]:
    """Show seconds as ms when every value is below one second."""
    if unit == "s" and peak < 1.0:
        return "ms", 1000.0
    return unit, 1.0


@dataclasses.dataclass
class _Frame:
    """The plot area of one panel and its data ranges: maps data to pixels."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float
    width: int = 420
    height: int = 270
    left: int = 62
    top: int = 34
    right: int = 14
    bottom: int = 58

    @property
    def plot_w(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> float:
        return self.height - self.top - self.bottom

    def px(self, x: float) -> float:
        return self.left + (x - self.x_low) / (self.x_high - self.x_low) * self.plot_w

    def py(self, y: float) -> float:
        return self.top + self.plot_h - (y - self.y_low) / (self.y_high - self.y_low) * self.plot_h


def _frame_for(
    series: list[tuple[list[float], list[float | None]]], factor: float
) -> tuple[_Frame, list[float], list[float]]:
    """The frame that fits ``series`` (values scaled by ``factor``), with its x and y ticks."""
    xs_all = [x for xs, _ in series for x in xs]
    ys_all = [y for _, ys in series for y in ys if y is not None]
    x_low, x_high = min(xs_all), max(xs_all)
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    y_ticks = _nice_ticks(min(0.0, min(ys_all) * factor), max(ys_all) * factor)
    y_low, y_high = y_ticks[0], y_ticks[-1]
    if y_high == y_low:
        y_high = y_low + 1
    x_ticks = [t for t in _nice_ticks(x_low, x_high) if x_low <= t <= x_high] or [x_low, x_high]
    return _Frame(x_low, x_high, y_low, y_high), x_ticks, y_ticks


def _axes_svg(
    frame: _Frame, panel: Panel, unit: str, x_ticks: list[float], y_ticks: list[float]
) -> list[str]:
    left, top, plot_w, plot_h = frame.left, frame.top, frame.plot_w, frame.plot_h
    out = [
        f'<svg class="panel" xmlns="http://www.w3.org/2000/svg" '
        f'width="{frame.width}" height="{frame.height}" '
        f'viewBox="0 0 {frame.width} {frame.height}" role="img" aria-label="{html.escape(panel.title)}">',
        f'<rect x="0" y="0" width="{frame.width}" height="{frame.height}" fill="#ffffff"/>',
        f'<text x="{left}" y="20" class="title">{html.escape(panel.title)}'
        + (f' <tspan class="unit">({html.escape(unit)})</tspan>' if unit else "")
        + "</text>",
    ]
    for tick in y_ticks:
        y = frame.py(tick)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(tick)}</text>')
    for tick in x_ticks:
        x = frame.px(tick)
        out.append(
            f'<line x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" y2="{top + plot_h + 4}" class="axis"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 17}" class="tick" text-anchor="middle">{_fmt(tick)}</text>'
        )
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 32}" class="axislabel" '
        'text-anchor="middle">iteration</text>'
    )
    return out


def _band_svg(
    frame: _Frame, series: list[tuple[list[float], list[float | None]]], factor: float
) -> list[str]:
    """The shaded area between a max series and a min series."""
    (xs_hi, ys_hi), (xs_lo, ys_lo) = series
    upper = [(frame.px(x), frame.py(y * factor)) for x, y in zip(xs_hi, ys_hi, strict=True) if y is not None]
    lower = [(frame.px(x), frame.py(y * factor)) for x, y in zip(xs_lo, ys_lo, strict=True) if y is not None]
    if not upper or not lower:
        return []
    points = upper + lower[::-1]
    return ['<polygon class="band" fill="' + _PALETTE[0] + '" points="'
            + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>']


def _series_svg(frame: _Frame, panel: Panel, unit: str, index: int, label: str, xs: list[float],
                ys: list[float | None], factor: float, count: int) -> list[str]:
    """One line with its points (hover titles) and its legend entry."""
    color = _PALETTE[index % len(_PALETTE)]
    dash = ' stroke-dasharray="5,3"' if panel.band and index == 1 else ""
    points = [(x, y * factor) for x, y in zip(xs, ys, strict=True) if y is not None]
    if not points:
        return []
    coords = " ".join(f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in points)
    out = [
        f'<polyline class="series" fill="none" stroke="{color}" stroke-width="2"{dash} points="{coords}"/>'
    ]
    if len(points) <= 200:
        out += [f'<circle cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" r="2.6" fill="{color}">'
                f"<title>{html.escape(label)}: iteration {x:g}, {y:.4g} {html.escape(unit)}</title></circle>"
                for x, y in points]
    legend_x = frame.left + index * (frame.plot_w / max(1, count))
    legend_y = frame.height - 10
    out.append(f'<line x1="{legend_x:.1f}" y1="{legend_y - 4}" x2="{legend_x + 18:.1f}" y2="{legend_y - 4}" '
               f'stroke="{color}" stroke-width="2"{dash}/>')
    out.append(f'<text x="{legend_x + 22:.1f}" y="{legend_y}" class="legend">{html.escape(label)}</text>')
    return out


def _svg_panel(panel: Panel, series: list[tuple[list[float], list[float | None]]]) -> str:
    """One panel as an inline SVG: axes, an optional min/max band, one line per series."""
    ys_all = [y for _, ys in series for y in ys if y is not None]
    unit, factor = _scale_unit(panel.unit, max(ys_all) if ys_all else 0.0)
    frame, x_ticks, y_ticks = _frame_for(series, factor)
    out = _axes_svg(frame, panel, unit, x_ticks, y_ticks)
    if panel.band and len(series) == 2:
        out += _band_svg(frame, series, factor)
    for index, ((xs, ys), label) in enumerate(zip(series, panel.labels, strict=True)):
        out += _series_svg(frame, panel, unit, index, label, xs, ys, factor, len(series))
    out.append("</svg>")
    return "\n".join(out)


_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px; color: #222;
       background: #f4f5f7; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
.meta { color: #666; font-size: 13px; margin-bottom: 18px; }
h2 { font-size: 16px; margin: 22px 0 8px 0; color: #333; }
.grid-panels { display: flex; flex-wrap: wrap; gap: 14px; }
svg.panel { border: 1px solid #d8dbe0; border-radius: 6px; box-shadow: 0 1px 2px rgba(0,0,0,.05); }
svg .title { font-size: 14px; font-weight: 600; fill: #222; }
svg .unit { font-weight: 400; fill: #666; }
svg .tick { font-size: 11px; fill: #555; }
svg .axislabel { font-size: 11px; fill: #777; }
svg .legend { font-size: 11px; fill: #333; }
svg .grid { stroke: #e6e8eb; stroke-width: 1; }
svg .axis { stroke: #999; }
svg .frame { fill: none; stroke: #bbb; }
svg .band { opacity: 0.16; }
svg circle:hover { r: 5; }
"""


def _x(record: MetricsRecord, x_key: str) -> float:
    """The record's value on the x axis: its ``timestamp``, else its ``iteration``."""
    return record.timestamp if x_key == "timestamp" else record.iteration


def render_html(records: Sequence[MetricsRecord], spec: Mapping[str, Any], source: str = "") -> str:
    """The dashboard page for metrics ``records`` (``shared.metrics_log.read_records``)."""
    x_key = spec.get("x", "iteration")
    keys: set[str] = set()
    for record in records:
        keys.update(record.metrics)
    title = spec.get("title", "torchprof step timings")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if records:
        first, last = _x(records[0], x_key), _x(records[-1], x_key)
        parts.append(
            f'<div class="meta">{html.escape(source)} &middot; {len(records)} log intervals, '
            f"iterations {first}&ndash;{last} &middot; hover a point for its value</div>"
        )
    else:
        parts.append(f'<div class="meta">{html.escape(source)}: no metrics recorded yet.</div>')
    panel_count = 0
    for section_name, panels in expand_panels(spec, sorted(keys)):
        svgs = []
        for panel in panels:
            if panel.kind == "heatmap" and panel.per_rank:
                per_rank = [(f"{_x(r, x_key):g}", r.per_rank.get(panel.per_rank)) for r in records]
                columns = [(x, values) for x, values in per_rank if isinstance(values, list) and values]
                if columns:
                    svgs.append(heatmap_svg(f"{panel.title} ({panel.unit}, per rank)", columns, _HEATMAP,
                                            against="median" if panel.relative else "score", x_name=x_key,
                                            span=2.0))
                continue
            series = []
            for key in panel.keys:
                xs: list[float] = []
                ys: list[float | None] = []
                for record in records:
                    value = record.metrics.get(key)
                    if value is not None:
                        xs.append(_x(record, x_key))
                        ys.append(value)
                series.append((xs, ys))
            if any(ys for _, ys in series):
                svgs.append(_svg_panel(panel, series))
        if svgs:
            panel_count += len(svgs)
            parts.append(f'<section><h2>{html.escape(section_name)}</h2><div class="grid-panels">')
            parts += svgs
            parts.append("</div></section>")
    parts.append(f"<!-- torchprof dashboard: {panel_count} panels -->")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
