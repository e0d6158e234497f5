"""``torchprof trend DIR...``: runs (or cycles of one run) compared over time, with a change test
that knows the run-to-run noise.

    torchprof trend run1 run2 ... run10 run11               # the last against the ones before it
    torchprof trend run11 run12 --baseline run1 ... run10   # each DIR against the baseline runs
    torchprof trend ... --json | --html trend.html

Each DIR is a run's --metrics-dir (metrics.jsonl: iteration-time, the timers, MFU, one sample per
logged interval) and/or traces (a profile directory or one cycle folder: each step's time, the
diagnose findings' savings).  A change is reported only when the U test of the per-step samples
against the baseline's (p < --alpha) and the modified z-score of the run's median among the baseline
runs' medians (> --z) both say so; the noise check prints how often the same rule flags one
baseline run against others (its false-positive rate on this data).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError, ExitStatus

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "trend",
        help="compare runs over time: step time, timers, MFU, diagnose findings, with a noise-aware "
        "change test",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="DIR",
        help="runs (--metrics-dir and/or --torch-profile-dir) or cycle folders, oldest first",
    )
    parser.add_argument(
        "--baseline", nargs="+", metavar="DIR", help="the baseline runs (default: every DIR but the last)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="a CI gate: after the report, exit with status 3 naming each series the report calls a "
        "regression (improvements pass)",
    )
    parser.add_argument("--html", metavar="HTML", help="also write the series as a self-contained HTML page")
    parser.add_argument(
        "--series",
        action="append",
        metavar="REGEX",
        help="only the series whose name matches (repeatable), e.g. 'iteration-time|timers/'",
    )
    parser.add_argument("--alpha", type=float, default=0.01, help="U test significance level (default 0.01)")
    parser.add_argument(
        "--z",
        type=float,
        default=3.5,
        dest="z_threshold",
        help="modified z-score beyond which a run is outside the baseline's run-to-run noise (default 3.5)",
    )
    parser.add_argument(
        "--min-change",
        type=float,
        default=0.5,
        metavar="PCT",
        help="smallest change reported, percent (default 0.5)",
    )
    parser.add_argument(
        "--quantile",
        type=float,
        default=0.25,
        metavar="Q",
        help="a run's level for the run-to-run test: this quantile of its samples (1-Q where higher is "
        "better); low, because neighbours only add time (default 0.25)",
    )
    parser.add_argument(
        "--skip-first",
        type=int,
        default=1,
        metavar="N",
        help="logged intervals left out at the start of each process (warm-up; default 1)",
    )
    parser.add_argument(
        "--splits",
        type=int,
        default=200,
        metavar="N",
        help="random splits of the baseline for the noise check (0: none; default 200)",
    )
    parser.set_defaults(func=_run, document=_document)


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s document and the exit status: what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.trend.change_test import Rule
    from torchprof_args.analysis.trend.report import trend
    from torchprof_args.analysis.trend.series import read_input

    if args.baseline:
        baseline_paths, input_paths = args.baseline, args.inputs
    elif len(args.inputs) < 2:
        raise CommandError(
            "give at least two runs (the last is compared with the ones before it), or --baseline"
        )
    else:
        baseline_paths, input_paths = args.inputs[:-1], args.inputs[-1:]
    for path in (*baseline_paths, *input_paths):
        if not Path(path).exists():
            raise CommandError(f"{path}: no such file or directory")
    baseline = [read_input(p, skip_first=args.skip_first) for p in baseline_paths]
    inputs = [read_input(p, skip_first=args.skip_first) for p in input_paths]
    if args.series:
        patterns = [re.compile(p) for p in args.series]
        for run in (*baseline, *inputs):
            run.series = {k: v for k, v in run.series.items() if any(p.search(k) for p in patterns)}
    if not 0 < args.quantile < 1:
        raise CommandError(f"--quantile {args.quantile:g}: expected a fraction between 0 and 1 (e.g. 0.25)")
    rule = Rule(args.alpha, args.z_threshold, args.min_change, args.quantile)
    doc = trend(inputs, baseline, rule=rule, splits=args.splits)
    if not doc["series"]:
        raise CommandError(
            "the runs share no series to compare (check --series and that the baseline runs logged "
            "the same keys)"
        )
    return doc, ExitStatus.OK


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.trend.report import format_trend, regression_gate, render_trend_html
    from torchprof_args.atomic import write_text_atomically

    doc, _ = _document(args)
    if args.html:
        write_text_atomically(Path(args.html), render_trend_html(doc))
    print(json.dumps(doc, indent=2) if args.json else format_trend(doc), flush=True)
    failed = regression_gate(doc) if args.fail_on_regression else None
    if failed:
        raise CommandError(failed, ExitStatus.REGRESSION)
    return 0
