"""``torchprof collectives DIR``: every collective of one profiled cycle matched across ranks.

    torchprof collectives prof/                 # the latest cycle of the traces in prof/
    torchprof collectives prof/ --cycle 120     # the cycle whose traces start at iteration 120
    torchprof collectives rank0.json rank1.json --json

Prints the ranks by the waiting they caused (they arrived last at collectives the others were
already waiting in), the collectives with the worst arrival skew, and a table per collective type
(:mod:`~torchprof_args.analysis.analyzers.collective_match` says how instances are matched).  Reads
each trace's summary sidecar (its rank's collectives are kept with its part of ``diagnose``) when it
matches, else parses the trace.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from torchprof_args.commands.common import Subparsers, add_clock_option
from torchprof_args.errors import ExitStatus

if TYPE_CHECKING:
    from torchprof_args.analysis.analyzers.collective_match import CycleCollectives

__all__ = ["register"]


def _report(args: argparse.Namespace) -> tuple[CycleCollectives, int]:
    """The cycle's collectives matched and the exit status (some traces unreadable: PARTLY_FAILED)."""
    from torchprof_args.analysis.collect.trace_results import DIAGNOSIS
    from torchprof_args.analysis.tools.collectives import collectives_report
    from torchprof_args.commands.cycles import cycle_results

    cycle_text, got = cycle_results(args.traces, args, (DIAGNOSIS,))
    report = collectives_report(got.results, cycle_text, top=max(args.top, args.rows),
                                align_clocks=args.align_clocks)
    return report, ExitStatus.PARTLY_FAILED if got.errors else ExitStatus.OK


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s document (plain JSON values) and the exit status: what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.jsonout import finite

    report, status = _report(args)
    return finite(report), status


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.render.collectives import format_collectives

    if args.json:
        out, status = _document(args)
        print(json.dumps(out))
        return status
    report, status = _report(args)
    print(format_collectives(report, rows=args.rows))
    return status


def register(subparsers: Subparsers) -> None:
    """Add ``torchprof collectives``."""
    p = subparsers.add_parser(
        "collectives", help="match collectives across ranks: arrival skew, last-arriving rank, bus bandwidth",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE_OR_DIR",
                   help="one cycle's per-rank traces, or directories")
    p.add_argument("--cycle", type=int, default=None, metavar="ITER",
                   help="the cycle whose trace file names start at this iteration (default: the latest)")
    p.add_argument("--json", action="store_true", help="the whole result as one JSON object (every instance)")
    p.add_argument("--rows", type=int, default=10, help="rows per table in the text output (default 10)")
    p.add_argument("--top", type=int, default=20, help="worst-skew instances listed in --json (default 20)")
    p.add_argument("--reparse", action="store_true", help="parse the traces even where a sidecar matches")
    add_clock_option(p)
    p.add_argument("--workers", type=int, default=None,
                   help="decoding processes per trace (default: as summary)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run, document=_document)
