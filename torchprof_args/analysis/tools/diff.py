"""``torchprof diff BASE NEW``: two traces, cycles or runs side by side, and what changed between them.

Each side is one or more per-rank summaries (sidecars where they match, else parsed by the same
streaming reader as ``summary``), aggregated per rank and step so sides with different numbers
of ranks or steps compare:

* step time (mean over ranks, and the slowest rank's), GPU idle / compute and communication/
  computation overlap (mean over ranks, HTA definitions), kernel time per class per step;
* operators and kernels inside the steps, per name (HTA ``TraceDiff``'s rules, see
  :mod:`.analyzers.step_ops`): calls and time per rank and step on each side, whether the name
  was added, removed or changed, sorted by the time it costs (+) or saves (-).

HTA's ``TraceDiff`` compares the same per-name counts and durations but loads both traces whole
into pandas; this needs only the summaries.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np

from torchprof_args.analysis.render.text import fmt_pct, fmt_us
from torchprof_args.analysis.summary import Summary

__all__ = ["OPERATOR_CHANGE_PCT", "STEP_METRICS", "Metric", "NameChange", "SideFigures", "SummaryDiff",
           "aggregate", "diff_summaries", "format_diff", "slower_than"]

#: a name whose calls per step are equal on both sides is "changed" when its time per step
#: moved by more than this (%), else "unchanged".
OPERATOR_CHANGE_PCT = 1.0
_KINDS = ("computation", "communication", "memory")
#: the metrics that are step times: ``--fail-above`` gates on them.
STEP_METRICS = ("step time (mean over ranks)", "slowest rank's mean step")


class SideFigures(TypedDict):
    """One side of a diff: its traces, ranks and rank-steps, the mean step over ranks and the
    slowest rank's, GPU idle / compute / overlap (mean over ranks, %), kernel time per class per
    step (None without kernels)."""

    traces: int
    ranks: list[int]
    rank_steps: int
    step_mean_us: float | None
    slowest_step_mean_us: float | None
    idle_pct: float | None
    compute_pct: float | None
    comm_comp_overlap_pct: float | None
    kernel_type_us_per_step: dict[str, float] | None


class Side(SideFigures):
    """:func:`aggregate`'s result: a side's figures and its per-name tables (``cpu`` operators and
    GPU ``kernels``: per name its category / class, calls and time per rank-step)."""

    cpu: dict[str, dict[str, Any]]
    kernels: dict[str, dict[str, Any]]


class Metric(TypedDict):
    """One figure on both sides (``unit``: ``us`` or ``%``) and how it moved."""

    name: str
    unit: str
    base: float | None
    new: float | None
    delta: float | None
    delta_pct: float | None


class NameChange(TypedDict):
    """One operator or kernel name: calls and time per rank-step on each side (None: absent there),
    ``added`` / ``removed`` / ``changed`` / ``unchanged``, and the deltas."""

    name: str
    kind: str
    status: str
    base_calls: float | None
    new_calls: float | None
    base_us: float | None
    new_us: float | None
    delta_calls: float
    delta_us: float


class SummaryDiff(TypedDict):
    """:func:`diff_summaries`' result (``torchprof diff --json`` adds ``findings``)."""

    base: SideFigures
    new: SideFigures
    metrics: list[Metric]
    kernels: list[NameChange]
    operators: list[NameChange]


def _mean(values: list[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return float(np.mean(data)) if data else None


def _gpu_steps(summary: Summary) -> int:
    """Steps the kernel totals cover (HTA leaves the last step out when there are two or more)."""
    n = len(summary.steps)
    return max(n - 1 if summary.gpu is not None and summary.gpu.last_step_excluded else n, 1)


#: per name: its category / class (``kind``), calls and time (``us``) per rank-step.
_Table = dict[str, dict[str, Any]]


def _add(table: _Table, name: str, kind: str, calls: int, total_us: float) -> None:
    entry = table.setdefault(name, {"kind": kind, "calls": 0.0, "us": 0.0})
    entry["calls"] += calls
    entry["us"] += total_us


def _per_step_tables(summaries: list[Summary]) -> tuple[_Table, _Table, int]:
    """Per CPU operator and per GPU kernel name over every rank: calls and time per rank-step (and
    the name's category / class); the number of rank-steps."""
    rank_steps = sum(s.ops_in_steps.steps for s in summaries)
    cpu: _Table = {}
    gpu: _Table = {}
    for s in summaries:
        for op in s.ops_in_steps.cpu:
            _add(cpu, op.name, op.cat, op.calls, op.total_us)
        for kernel in s.ops_in_steps.gpu:
            _add(gpu, kernel.name, kernel.type, kernel.calls, kernel.total_us)
    for entry in (*cpu.values(), *gpu.values()):
        entry["calls"] /= max(rank_steps, 1)
        entry["us"] /= max(rank_steps, 1)
    return cpu, gpu, rank_steps


def aggregate(summaries: list[Summary]) -> Side:
    """One side of a diff: its figures per rank and step, and its per-name tables."""
    gpus = [s.gpu for s in summaries if s.gpu is not None]
    kinds: dict[str, float] = {}
    for s in summaries:
        if s.gpu is None:
            continue
        for name, value in {**s.gpu.kernel_type_us, **s.gpu.kernel_type_overlapping_us}.items():
            kinds[name] = kinds.get(name, 0.0) + value / _gpu_steps(s) / len(gpus)
    cpu, kernels, rank_steps = _per_step_tables(summaries)
    step_means = [s.step_mean_us for s in summaries]
    return {
        "traces": len(summaries),
        "ranks": sorted({s.rank for s in summaries if s.rank is not None}),
        "rank_steps": rank_steps,
        "step_mean_us": _mean(step_means),
        "slowest_step_mean_us": max((v for v in step_means if v is not None), default=None),
        "idle_pct": _mean([g.idle_pct for g in gpus]),
        "compute_pct": _mean([g.compute_pct for g in gpus]),
        "comm_comp_overlap_pct": _mean([g.comm_comp_overlap_pct for g in gpus]),
        "kernel_type_us_per_step": kinds if gpus else None,
        "cpu": cpu,
        "kernels": kernels,
    }


def _metric(name: str, unit: str, base: float | None, new: float | None) -> Metric:
    delta = None if base is None or new is None else new - base
    pct = None if delta is None or not base else 100.0 * delta / base
    return {"name": name, "unit": unit, "base": base, "new": new, "delta": delta, "delta_pct": pct}


def _metrics(base: SideFigures, new: SideFigures) -> list[Metric]:
    out = [_metric(STEP_METRICS[0], "us", base["step_mean_us"], new["step_mean_us"]),
           _metric(STEP_METRICS[1], "us", base["slowest_step_mean_us"], new["slowest_step_mean_us"]),
           _metric("GPU idle", "%", base["idle_pct"], new["idle_pct"]),
           _metric("GPU compute", "%", base["compute_pct"], new["compute_pct"]),
           _metric("comm/comp overlap", "%", base["comm_comp_overlap_pct"], new["comm_comp_overlap_pct"])]
    bk, nk = base["kernel_type_us_per_step"] or {}, new["kernel_type_us_per_step"] or {}
    names = [k for k in _KINDS if k in bk or k in nk] + sorted((set(bk) | set(nk)) - set(_KINDS))
    out += [_metric(f"kernel time per step: {k}", "us", bk.get(k), nk.get(k)) for k in names]
    return out


def _compare(base: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[NameChange]:
    """Per name on either side: calls and time per rank-step on each, status, deltas; sorted by
    the size of the time delta (largest cost or saving first)."""
    rows: list[NameChange] = []
    for name in set(base) | set(new):
        b, n = base.get(name), new.get(name)
        b_us, n_us = (b["us"] if b else 0.0), (n["us"] if n else 0.0)
        b_calls, n_calls = (b["calls"] if b else 0.0), (n["calls"] if n else 0.0)
        if b is None:
            status = "added"
        elif n is None:
            status = "removed"
        elif (abs(n_calls - b_calls) > 1e-9
              or abs(n_us - b_us) > OPERATOR_CHANGE_PCT / 100.0 * max(b_us, 1e-9)):
            status = "changed"
        else:
            status = "unchanged"
        either = n if n is not None else base[name]
        rows.append({"name": name, "kind": either["kind"], "status": status,
                     "base_calls": b_calls if b else None, "new_calls": n_calls if n else None,
                     "base_us": b_us if b else None, "new_us": n_us if n else None,
                     "delta_calls": n_calls - b_calls, "delta_us": n_us - b_us})
    rows.sort(key=lambda r: (-abs(r["delta_us"]), r["name"]))
    return rows


def diff_summaries(base: list[Summary], new: list[Summary]) -> SummaryDiff:
    """The diff of two sides' per-rank summaries.

    Args:
        base: one side's summaries, complete (``top=None``, or sidecars'); ``new`` the other's.

    Returns:
        ``{"base", "new"}`` (each side's figures), ``"metrics"`` (step time, GPU idle / compute,
        overlap, kernel time per class: base, new, delta), ``"kernels"`` and ``"operators"`` (per
        name: calls and time per rank-step on each side, added / removed / changed / unchanged,
        largest time delta first): docs/guides/trace-toolkit.md shows one.
    """
    a, b = aggregate(base), aggregate(new)
    return {
        "base": _figures(a),
        "new": _figures(b),
        "metrics": _metrics(a, b),
        "kernels": _compare(a["kernels"], b["kernels"]),
        "operators": _compare(a["cpu"], b["cpu"]),
    }


def slower_than(result: SummaryDiff, pct: float) -> list[str] | None:
    """``torchprof diff --fail-above PCT``'s reading of the diff: what got slower by more than ``pct``
    percent (the step figures, then operators and kernels, largest first), each as ``name +x.x %``;
    None when BASE has no step time to measure by.

    A step figure (:data:`STEP_METRICS`) fails when its ``delta_pct`` is above ``pct``; an operator or
    kernel (added or changed) when the time per rank-step it gained (``delta_us``) is above ``pct``
    percent of BASE's mean step (what it costs each step; its own percentage would flag every 2 us
    operator that took 3 us).
    """
    step_us = result["base"]["step_mean_us"]
    if not step_us:
        return None
    steps = [f"{m['name']} +{m['delta_pct']:.1f} %" for m in result["metrics"]
             if m["name"] in STEP_METRICS and m["delta_pct"] is not None and m["delta_pct"] > pct]
    names = [(100.0 * r["delta_us"] / step_us, f"{what} {_short(r['name'])}")
             for what, rows in (("kernel", result["kernels"]), ("operator", result["operators"]))
             for r in rows if r["status"] in ("added", "changed") and 100.0 * r["delta_us"] / step_us > pct]
    names.sort(key=lambda item: -item[0])
    return steps + [f"{name} +{share:.1f} % of the step" for share, name in names]


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _figures(side: Side) -> SideFigures:
    """The side's figures without its per-name tables."""
    return {"traces": side["traces"], "ranks": side["ranks"], "rank_steps": side["rank_steps"],
            "step_mean_us": side["step_mean_us"], "slowest_step_mean_us": side["slowest_step_mean_us"],
            "idle_pct": side["idle_pct"], "compute_pct": side["compute_pct"],
            "comm_comp_overlap_pct": side["comm_comp_overlap_pct"],
            "kernel_type_us_per_step": side["kernel_type_us_per_step"]}


def _signed_us(value: float | None) -> str:
    if value is None:
        return "-"
    return ("+" if value >= 0 else "-") + fmt_us(abs(value))


def _metric_line(m: Metric, width: int) -> str:
    if m["unit"] == "%":
        base, new = fmt_pct(m["base"]), fmt_pct(m["new"])
        delta = "-" if m["delta"] is None else f"{m['delta']:+.2f} pt"
    else:
        base, new = fmt_us(m["base"]), fmt_us(m["new"])
        delta = _signed_us(m["delta"]) + ("" if m["delta_pct"] is None else f" ({m['delta_pct']:+.1f}%)")
    name = m["name"].replace("kernel time per step: ", "  ")
    return f"  {name:<{width}} {base:>12} {new:>12}   {delta}"


def _side_text(label: str, where: str, side: SideFigures) -> str:
    ranks = side["ranks"]
    if not ranks:
        rank_text = "no rank"
    else:
        rank_text = "rank " + str(ranks[0]) if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
    return f"{label} {where} ({side['traces']} trace(s), {rank_text}, {side['rank_steps']} rank-step(s))"


def _names_section(title: str, rows: list[NameChange], limit: int) -> list[str]:
    if not rows:
        return [f"{title}: none on either side"]
    statuses = ("added", "removed", "changed", "unchanged")
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in statuses}
    moved = [r for r in rows if r["status"] != "unchanged"]
    lines = [f"{title} per rank and step, by time cost (+) or saving (-): " + ", ".join(
        f"{n} {s}" for s, n in counts.items())]
    if not moved:
        return lines
    lines.append(f"  {'change':<9} {'time/step':>11} {'calls/step':>23} {'time/step':>25}  name")
    lines.append(f"  {'':<9} {'delta':>11} {'BASE -> NEW':>23} {'BASE -> NEW':>25}")
    for r in moved[:limit]:
        calls = f"{_num(r['base_calls'])} -> {_num(r['new_calls'])}"
        times = f"{fmt_us(r['base_us']) if r['base_us'] is not None else '-'} -> " \
                f"{fmt_us(r['new_us']) if r['new_us'] is not None else '-'}"
        name = r["name"] if len(r["name"]) <= 80 else r["name"][:77] + "..."
        lines.append(f"  {r['status']:<9} {_signed_us(r['delta_us']):>11} {calls:>23} {times:>25}  {name}")
    if len(moved) > limit:
        lines.append(f"  ... {len(moved) - limit} more (--rows N, or --json for all)")
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}".rstrip("0").rstrip(".")


def format_diff(result: SummaryDiff, base_label: str, new_label: str, rows: int = 15) -> str:
    """Human-readable ``torchprof diff`` output.

    Args:
        result: :func:`diff_summaries`' result.
        base_label: what the base side is (the path given); ``new_label`` the other.
        rows: names listed per table at most.

    Returns:
        The text: each side, the figures that moved, the kernels and operators by the time they
        cost or save.
    """
    metrics = [m for m in result["metrics"] if m["base"] is not None or m["new"] is not None]
    width = max(len(m["name"].replace("kernel time per step: ", "  ")) for m in metrics)
    lines = ["== torchprof diff", _side_text("BASE", base_label, result["base"]),
             _side_text("NEW ", new_label, result["new"]), "",
             f"  {'':<{width}} {'BASE':>12} {'NEW':>12}   delta"]
    headed = False
    for m in metrics:
        if m["name"].startswith("kernel time per step: ") and not headed:
            lines.append("  kernel time per step (exclusive; HTA's classes):")
            headed = True
        lines.append(_metric_line(m, width))
    lines.append("")
    lines += _names_section("GPU kernels", result["kernels"], rows)
    lines.append("")
    lines += _names_section("CPU operators", result["operators"], rows)
    return "\n".join(lines) + "\n"
