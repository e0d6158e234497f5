"""``torchprof goodput RUN_DIR``: the share of a job's wall time that trained the model, and where
the rest went (start-up, checkpoints, data, evaluation, profiling, hangs, restarts).

    torchprof goodput RUN_DIR            # RUN_DIR: the job's --metrics-dir (its metrics.jsonl)
    torchprof goodput RUN_DIR --json     # {"version": 1, "wall_s", "productive_s", "goodput", "lost_s"}

Reads metrics.jsonl across the runs appended to it (each process marks its start and end); the
categories come from the step timers (save-checkpoint, load-checkpoint, batch-generator, evaluate,
... or --timer CATEGORY=NAME) and the profiler's own figures (pass extra=prof.stats to log_step).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError

__all__ = ["register"]

_TIMED = ("checkpoint", "data", "evaluation")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "goodput",
        help="productive share of a job's wall time and the time lost, by cause, from metrics.jsonl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the job's --metrics-dir (or its metrics.jsonl)")
    parser.add_argument("--json", action="store_true", help="print the ledger as JSON")
    parser.add_argument(
        "--timer",
        action="append",
        default=[],
        metavar="CATEGORY=NAME",
        help=f"also count step timer NAME as CATEGORY ({', '.join(_TIMED)}); repeatable",
    )
    parser.set_defaults(func=_run)


def _timer_categories(pairs: list[str]) -> dict[str, tuple[str, ...]]:
    from torchprof_args.capture.metrics.goodput import TIMER_CATEGORIES

    categories = {key: tuple(names) for key, names in TIMER_CATEGORIES.items()}
    for pair in pairs:
        category, _, name = pair.partition("=")
        if category not in _TIMED or not name:
            raise CommandError(
                f"--timer {pair!r}: expected CATEGORY=NAME with CATEGORY one of {', '.join(_TIMED)} "
                "(e.g. --timer checkpoint=save)"
            )
        categories[category] += (name,)
    return categories


def metrics_file(run_dir: str) -> Path:
    """``RUN_DIR/metrics.jsonl`` (or RUN_DIR itself when it is the file); a CommandError when absent."""
    from torchprof_args.naming import METRICS_FILENAME

    path = Path(run_dir)
    path = path if path.is_file() else path / METRICS_FILENAME
    if not path.is_file():
        raise CommandError(
            f"{path} not found: point RUN_DIR at a run's --metrics-dir (metrics.jsonl is written "
            "with --metrics-sinks jsonl, the default)"
        )
    return path


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.capture.metrics.goodput import build_ledger, format_ledger
    from torchprof_args.shared.metrics_log import read_runs

    path = metrics_file(args.run_dir)
    try:
        segments = read_runs(path)
    except (OSError, ValueError) as err:
        raise CommandError(str(err)) from None
    if not any(segment.records for segment in segments):
        raise CommandError(f"{path} holds no metrics record yet: goodput needs at least one logged interval")
    ledger = build_ledger(segments, timers=_timer_categories(args.timer))
    print(json.dumps(ledger.to_json(), indent=2) if args.json else format_ledger(ledger, str(path)))
    return 0
