"""``torchprof trend``'s report: every series of every input against the baseline runs, as JSON, text
and a self-contained HTML page (one SVG per series)."""

from __future__ import annotations

import html
import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from torchprof_args.analysis.trend.change_test import DEFAULT_RULE, MIN_RUNS_FOR_Z, Rule, compare
from torchprof_args.analysis.trend.series import RunData

__all__ = ["TREND_VERSION", "format_trend", "noise_splits", "regression_gate", "render_trend_html", "trend"]

TREND_VERSION = 1


def trend(
    inputs: Sequence[RunData],
    baseline: Sequence[RunData],
    *,
    rule: Rule = DEFAULT_RULE,
    splits: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """The report (``--json``'s schema): each series of each input compared with the baseline runs,
    the regressions, and the rule's false-positive rate over random splits of the baseline."""
    names = sorted({name for run in baseline for name in run.series})
    series_docs: list[dict[str, Any]] = []
    for name in names:
        runs = [run.series[name] for run in baseline if name in run.series and run.series[name].samples]
        if not runs or _all_zero(name, baseline, inputs):
            continue
        higher = runs[0].higher_is_better
        q = 1.0 - rule.quantile if higher else rule.quantile
        results = []
        for run in inputs:
            own = run.series.get(name)
            if own is None or not own.samples:
                continue
            result = compare(own.samples, [r.samples for r in runs], higher_is_better=higher, rule=rule)
            results.append(
                {
                    "path": run.path,
                    "label": run.label,
                    "median": result.median,
                    "level": result.level,
                    "change_pct": _finite(result.change_pct),
                    "median_change_pct": _finite(result.median_change_pct),
                    "p_value": result.p_value,
                    "z": _finite(result.z),
                    "samples": result.samples,
                    "verdict": result.verdict,
                    "p10": _quantile(own.samples, 0.1),
                    "p90": _quantile(own.samples, 0.9),
                }
            )
        series_docs.append(
            {
                "name": name,
                "unit": runs[0].unit,
                "higher_is_better": higher,
                "quantile": q,
                "baseline": {
                    "runs": len(runs),
                    "median": float(np.median([v for r in runs for v in r.samples])),
                    "level": _quantile([v for r in runs for v in r.samples], q),
                    "run_medians": [float(np.median(r.samples)) for r in runs],
                    "run_levels": [_quantile(r.samples, q) for r in runs],
                    "labels": [run.label for run in baseline if name in run.series],
                },
                "results": results,
            }
        )
    flagged = [
        {
            "series": doc["name"],
            "path": r["path"],
            "label": r["label"],
            "change_pct": r["change_pct"],
            "p_value": r["p_value"],
            "z": r["z"],
        }
        for doc in series_docs
        for r in doc["results"]
        if r["verdict"] == "regression"
    ]
    better = [
        {"series": doc["name"], "path": r["path"], "change_pct": r["change_pct"]}
        for doc in series_docs
        for r in doc["results"]
        if r["verdict"] == "improvement"
    ]
    return {
        "version": TREND_VERSION,
        "rule": {
            "alpha": rule.alpha,
            "z_threshold": rule.z_threshold,
            "min_change_pct": rule.min_change_pct,
            "quantile": rule.quantile,
        },
        "baseline": [run.path for run in baseline],
        "inputs": [run.path for run in inputs],
        "series": series_docs,
        "regressions": flagged,
        "improvements": better,
        "noise_check": _noise_check(baseline, names, rule, splits, seed),
    }


def _all_zero(name: str, *groups: Sequence[RunData]) -> bool:
    return all(
        v == 0 for group in groups for run in group if name in run.series for v in run.series[name].samples
    )


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def _quantile(samples: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(samples, dtype=float), q))


def _noise_check(
    baseline: Sequence[RunData], names: Sequence[str], rule: Rule, splits: int, seed: int
) -> dict[str, Any] | None:
    """The rule on ``splits`` random splits of the baseline (one run against a random subset of at
    least three others, every series): how often a run that is only noise gets a regression."""
    if len(baseline) < MIN_RUNS_FOR_Z + 1 or splits <= 0:
        return None
    flagged = 0
    for index, others in noise_splits(len(baseline), splits, seed):
        candidate, rest = baseline[index], [baseline[i] for i in others]
        for name in names:
            own = candidate.series.get(name)
            runs = [r.series[name].samples for r in rest if name in r.series and r.series[name].samples]
            if own is None or not own.samples or not runs or _all_zero(name, [candidate], rest):
                continue
            if (
                compare(own.samples, runs, higher_is_better=own.higher_is_better, rule=rule).verdict
                == "regression"
            ):
                flagged += 1
                break
    return {"splits": splits, "flagged": flagged, "false_positive_rate": flagged / splits}


def noise_splits(runs: int, splits: int, seed: int = 0) -> Iterator[tuple[int, list[int]]]:
    """The noise check's random splits of ``runs`` baseline runs: (a run, a random subset of at least
    :data:`MIN_RUNS_FOR_Z` of the others), by index; the same for the same seed."""
    rng = random.Random(seed)
    for _ in range(splits):
        order = list(range(runs))
        rng.shuffle(order)
        yield order[0], order[1 : 1 + rng.randint(MIN_RUNS_FOR_Z, runs - 1)]


def _ordinal(fraction: float) -> str:
    number = round(fraction * 100)
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _value(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.2f} ms"
    return f"{value:.4g} {unit}".strip()


def format_trend(doc: dict[str, Any]) -> str:
    """The text report: one table per input, then the regressions and the noise check."""
    base = doc["baseline"]
    lines = [
        f"trend: {len(doc['inputs'])} run(s) against a baseline of {len(base)} run(s) "
        f"(U test p < {doc['rule']['alpha']:g}, modified z > {doc['rule']['z_threshold']:g}, change >= "
        f"{doc['rule']['min_change_pct']:g} %)",
        f"level: the {_ordinal(doc['rule']['quantile'])} percentile of a run's samples (the "
        f"{_ordinal(1 - doc['rule']['quantile'])} where higher is better); median: the median's change",
    ]
    for path in doc["inputs"]:
        lines += [
            "",
            f"{path}:",
            f"  {'series':34s}{'baseline':>12s}{'this run':>12s}{'change':>9s}{'median':>9s}{'p':>9s}"
            f"{'z':>7s}"
            "  verdict",
        ]
        for series in doc["series"]:
            for r in series["results"]:
                if r["path"] != path:
                    continue
                change = "n/a" if r["change_pct"] is None else f"{r['change_pct']:+.1f} %"
                median = "n/a" if r["median_change_pct"] is None else f"{r['median_change_pct']:+.1f} %"
                p = "n/a" if r["p_value"] is None else f"{r['p_value']:.0e}"
                z = (
                    "inf"
                    if r["z"] is None and r["verdict"] != "same"
                    else ("n/a" if r["z"] is None else f"{r['z']:+.1f}")
                )
                verdict = r["verdict"].upper() if r["verdict"] != "same" else "same"
                lines.append(
                    f"  {series['name']:34s}{_value(series['baseline']['level'], series['unit']):>12s}"
                    f"{_value(r['level'], series['unit']):>12s}{change:>9s}{median:>9s}{p:>9s}{z:>7s}"
                    f"  {verdict}"
                )
    lines.append("")
    if doc["regressions"]:
        lines.append("regressions: " + _regressions_text(doc["regressions"]))
    else:
        lines.append("regressions: none")
    check = doc["noise_check"]
    if check is None:
        lines.append(f"noise check: needs at least {MIN_RUNS_FOR_Z + 1} baseline runs")
    else:
        lines.append(
            f"noise check: the same rule flags {check['flagged']} of {check['splits']} random splits of "
            f"the baseline runs (false-positive rate {check['false_positive_rate']:.1%})"
        )
    return "\n".join(lines)


def _regressions_text(regressions: Sequence[dict[str, Any]]) -> str:
    return "; ".join(
        f"{r['series']} {r['change_pct']:+.1f} % in {r['label']}"
        if r["change_pct"] is not None
        else f"{r['series']} (new) in {r['label']}"
        for r in regressions
    )


def regression_gate(doc: dict[str, Any]) -> str | None:
    """``--fail-on-regression``'s verdict on the report: None without regressions, else the error
    line naming each series the report calls a regression (its verdict: no second rule), its change
    and the run; the noise check's false-positive rate is the gate's on this baseline."""
    if not doc["regressions"]:
        return None
    return (
        f"regression beyond the baseline runs' noise (--fail-on-regression): "
        f"{_regressions_text(doc['regressions'])}; find its cause in the report above, or make the run "
        "a baseline run if the change is meant"
    )


def render_trend_html(doc: dict[str, Any]) -> str:
    """A self-contained page: per series, each run's level (baseline grey, others blue, regressions
    red; their p10-p90 as a bar) over the baseline runs' median level and its run-to-run band (the
    levels a run may have and not be flagged: median +- z x MAD / 0.6745)."""
    panels = [_series_svg(series, doc["rule"]["z_threshold"]) for series in doc["series"]]
    items = []
    for r in doc["regressions"]:
        size = "new" if r["change_pct"] is None else f"{r['change_pct']:+.1f} %"
        items.append(f"<li>{html.escape(r['series'])}: {html.escape(r['label'])} {size}</li>")
    regressions = "".join(items) or "<li>none</li>"
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>torchprof trend</title><style>"
        "body{font-family:sans-serif;margin:20px} svg{margin:6px;border:1px solid #ddd}"
        "</style></head><body><h1>torchprof trend</h1>"
        f"<p>{len(doc['inputs'])} run(s) against a baseline of {len(doc['baseline'])}.</p>"
        f"<h2>Regressions</h2><ul>{regressions}</ul><h2>Series</h2>{''.join(panels)}</body></html>\n"
    )


def _series_svg(series: dict[str, Any], z_threshold: float, width: int = 460, height: int = 240) -> str:
    base = series["baseline"]
    points = [(label, m, m, m, "#888") for label, m in zip(base["labels"], base["run_levels"], strict=False)]
    colour = {"regression": "#d62728", "improvement": "#2ca02c", "same": "#1f77b4"}
    points += [(r["label"], r["level"], r["p10"], r["p90"], colour[r["verdict"]]) for r in series["results"]]
    levels = np.asarray(base["run_levels"], dtype=float)
    centre = float(np.median(levels))
    band = z_threshold * float(np.median(np.abs(levels - centre))) / 0.6745
    values = [v for p in points for v in p[1:4]] + [centre - band, centre + band]
    low, high = min(values), max(values)
    span = (high - low) or abs(high) or 1.0
    low, high = low - span * 0.1, high + span * 0.1
    left, top, plot_w, plot_h = 60, 30, width - 80, height - 70

    def y(value: float) -> float:
        return top + plot_h * (1 - (value - low) / (high - low))

    step = plot_w / max(1, len(points))
    parts = [
        f"<svg class='trend' width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>",
        f"<text x='{left}' y='18' font-size='13'>{html.escape(series['name'])} ({series['unit']})</text>",
        f"<rect x='{left}' y='{y(centre + band):.1f}' width='{plot_w}' "
        f"height='{max(0.0, y(centre - band) - y(centre + band)):.1f}' fill='#eee'/>",
        f"<line x1='{left}' x2='{left + plot_w}' y1='{y(centre):.1f}' y2='{y(centre):.1f}' stroke='#888' "
        "stroke-dasharray='4'/>",
    ]
    for tick in (low + span * 0.1, centre, high - span * 0.1):
        parts.append(
            f"<text x='{left - 4}' y='{y(tick) + 4:.1f}' font-size='10' text-anchor='end'>{tick:.4g}</text>"
        )
    for i, (label, median, p10, p90, fill) in enumerate(points):
        x = left + step * (i + 0.5)
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y(p10):.1f}' y2='{y(p90):.1f}' stroke='{fill}'/>")
        parts.append(
            f"<circle cx='{x:.1f}' cy='{y(median):.1f}' r='4' fill='{fill}'><title>{html.escape(label)}: "
            f"{median:.6g}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)
