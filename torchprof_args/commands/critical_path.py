"""``torchprof critical-path PATH``: the longest path through each step, across every rank.

    torchprof critical-path prof/                   # the latest profiled cycle of a run folder
    torchprof critical-path prof/ --cycle 120       # the cycle whose traces start at iteration 120
    torchprof critical-path prof/ --what-if "no data loader" --what-if "rank 3 like the median"
    torchprof critical-path rank0.pt.trace.json.gz --json

Builds one dependency graph over all ranks' traces of a cycle (on each rank: CPU operators per
thread, launches to kernels, kernels per stream, synchronisations and waits; across ranks: every
matched collective and send/recv), and prints per step the path's length beside the step's (they
must agree), its time by rank and by category, and the operators and kernels with the most time on
it.  ``--what-if`` answers a question with the step the graph predicts (docs/guides/critical-path.md
lists the questions).  Reads each trace's summary sidecar when it matches (its reduced graph is
computed when the trace is published), else parses the trace.  ``--json``: the schema of
docs/guides/critical-path.md.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchprof_args.commands.common import Subparsers, add_clock_option
from torchprof_args.errors import CommandError, ExitStatus

__all__ = ["register"]


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s document (plain JSON values) and the exit status: what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.collect.trace_results import CRITICAL_PATH
    from torchprof_args.analysis.critical_path.job_paths import critical_path
    from torchprof_args.analysis.critical_path.whatif import parse_what_if
    from torchprof_args.analysis.jsonout import finite
    from torchprof_args.commands.cycles import cycle_results

    try:
        questions = [parse_what_if(q) for q in args.what_if]
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    cycle_text, got = cycle_results([args.path], args, (CRITICAL_PATH,))
    doc = critical_path(got.paths, args.path, cycle_text, questions, align_clocks=args.align_clocks)
    if not doc.steps:
        raise CommandError(f"{args.path}: the traces have no events to build a path from")
    return finite(doc), ExitStatus.PARTLY_FAILED if got.errors else ExitStatus.OK


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.render.critical_path import format_critical_path

    out, status = _document(args)
    print(json.dumps(out) if args.json else format_critical_path(out, rows=args.rows))
    return status


def register(subparsers: Subparsers) -> None:
    """Add ``torchprof critical-path``."""
    p = subparsers.add_parser(
        "critical-path", help="the longest path through each step across all ranks, and what-if answers",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="a trace, a cycle folder, or a run folder (its latest cycle)")
    p.add_argument("--cycle", type=int, default=None, metavar="ITER",
                   help="the cycle whose traces start at this iteration (default: the latest)")
    p.add_argument("--what-if", action="append", default=[], metavar="SPEC",
                   help="a question answered with the predicted step, e.g. 'no data loader', 'rank 3 like "
                        "the median', 'communication fully overlapped', 'gemm 2x faster' (repeatable)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: version, path, ranks, step_ms, steps, top, what_if, notes")
    p.add_argument("--rows", type=int, default=5, help="operators and kernels listed in the text (default 5)")
    p.add_argument("--reparse", action="store_true", help="parse the traces even where a sidecar matches")
    add_clock_option(p)
    p.add_argument("--workers", type=int, default=None,
                   help="decoding processes per trace (default: as summary)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run, document=_document)
