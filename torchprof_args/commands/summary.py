"""``torchprof summary``: one trace's summary, or many ranks' cross-rank views; sidecar writing.

* ``torchprof summary TRACE`` prints the trace's summary;
* ``torchprof summary RUN_OR_CYCLE_DIR...`` prints, per profiled cycle, the cross-rank view
  (distributions over ranks, slowest and fastest ranks) and the slowest rank's summary
  (``--per-rank``: every rank's; ``--all-ranks``: every rank's line in the view);
* ``--json`` prints one object per trace, then one ``{"cross_rank": ..., "cycle": ...}`` per cycle;
* ``--write-sidecars [--shard K/N|auto]`` parses the traces without a matching sidecar (of one
  stable shard of them) and publishes their sidecars, for clusters' own schedulers to spread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args.capture.flags.types import positive_int
from torchprof_args.commands.common import INPUTS_HELP, Subparsers, top_count
from torchprof_args.errors import CommandError, ExitStatus

if TYPE_CHECKING:
    from torchprof_args.analysis.summary import CrossRankView, Summary

__all__ = ["register"]


def _write_sidecars(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.collect.discover import expand
    from torchprof_args.analysis.collect.pool import collect
    from torchprof_args.analysis.collect.shard import parse_shard, shard_files
    from torchprof_args.analysis.collect.trace_results import Outcome
    from torchprof_args.analysis.decode.loader import release_memory_eagerly
    from torchprof_args.naming import sidecar_path

    release_memory_eagerly()
    files = expand(args.traces)
    k, n = parse_shard(args.shard) if args.shard else (0, 1)
    mine = shard_files(files, k, n)
    where = f"shard {k}/{n}: " if n > 1 else ""

    def told(path: Path, result: Outcome) -> None:
        if result.sidecar_written:
            print(f"{where}wrote {sidecar_path(path)} ({result.parsed_bytes / 1e6:,.1f} MB of trace JSON)",
                  flush=True)

    got = collect(mine, top=args.top, reparse=args.reparse, write=True, keep=False, workers=args.workers,
                  progress=not args.no_progress, on_parsed=told)
    for error in got.errors:
        print(f"torchprof summary: {error}", file=sys.stderr)
    rate = f", {got.parsed_bytes / 1e6 / got.parse_seconds:,.0f} MB/s" if got.parse_seconds > 0 else ""
    print(f"{where}{len(mine)} of {len(files)} trace(s): {got.sidecars_written} sidecar(s) written "
          f"({got.parsed_bytes / 1e6:,.0f} MB parsed in {got.parse_seconds:.1f} s{rate}), "
          f"{got.from_sidecars} already up to date, {len(got.errors)} failed")
    return ExitStatus.PARTLY_FAILED if got.errors else ExitStatus.OK


def _cycles(args: argparse.Namespace) -> tuple[list[tuple[str, list[Summary], CrossRankView | None]], int]:
    """Per cycle: its label, its summaries and its cross-rank view (None for one trace); the exit status."""
    from torchprof_args.analysis.summary import cross_rank
    from torchprof_args.commands.cycles import cycle_summaries

    cycles, got = cycle_summaries(args.traces, args, args.top)
    many = len(got.summaries) > 1 or any(Path(t).is_dir() for t in args.traces)
    found = [(cycle.label, summaries, cross_rank(summaries, k=args.slowest) if many else None)
             for cycle, summaries in cycles]
    return found, ExitStatus.PARTLY_FAILED if got.errors else ExitStatus.OK


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s lines as one document, ``{"lines": [...]}`` (each line's object, in order), and the
    exit status: what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.jsonout import finite

    found, status = _cycles(args)
    lines: list[Any] = []
    for label, summaries, view in found:
        lines += [finite(s) for s in summaries]
        if view is not None:
            lines.append({"cross_rank": finite(view), "cycle": label})
    return {"lines": lines}, status


def _summary(args: argparse.Namespace) -> int:
    if args.shard and not args.write_sidecars:
        raise CommandError("--shard splits the work of --write-sidecars between tasks; add --write-sidecars")
    if args.write_sidecars:
        return _write_sidecars(args)
    if args.json:
        doc, status = _document(args)
        for line in doc["lines"]:
            print(json.dumps(line))
        return status
    found, status = _cycles(args)
    for label, summaries, view in found:
        _print_text(args, summaries, view, label)
        sys.stdout.flush()
    return status


def _print_text(args: argparse.Namespace, summaries: list[Summary], view: CrossRankView | None,
                label: str) -> None:
    from torchprof_args.analysis.render.text import format_cross_rank, format_summary

    if view is None:
        print(format_summary(summaries[0], rows=args.rows))
        return
    print(format_cross_rank(view, label, all_ranks=args.all_ranks))
    if args.per_rank:
        shown = summaries
    else:
        shown = [s for s in summaries if s.rank == view.slowest_rank][:1] or summaries[:1]
        print(f"-- summary of the slowest rank ({shown[0].rank}); --per-rank prints every rank's")
    for s in shown:
        print(format_summary(s, rows=args.rows))


def register(subparsers: Subparsers, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``torchprof summary`` (``parents``: the shared --no-progress / --reparse options)."""
    p = subparsers.add_parser(
        "summary", parents=parents,
        help="per-rank summaries and cross-rank views of Kineto traces (HTA numbers)",
        description="Summarise traces: steps, GPU idle/compute/communication/overlap (HTA definitions), top "
        "kernels and CPU operators, memory; for several ranks, a cross-rank view per profiled cycle. Reads "
        "each trace's summary sidecar (summaries/<stem>.summary.json) when it matches the trace, else parses "
        "the trace.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE_OR_DIR", help=INPUTS_HELP)
    p.add_argument("--json", action="store_true",
                   help="one JSON object per trace, then one cross_rank object per cycle")
    p.add_argument("--top", type=top_count, default=30,
                   help="entries in the top-N lists, or 'all' (default 30)")
    p.add_argument("--rows", type=int, default=10, help="rows per table in the text output (default 10)")
    p.add_argument("--slowest", type=positive_int, default=5, metavar="K",
                   help="the K slowest and K fastest ranks in the cross-rank view (default 5)")
    p.add_argument("--all-ranks", action="store_true", help="one line per rank in the cross-rank view")
    p.add_argument("--per-rank", action="store_true",
                   help="every rank's summary, not only the slowest rank's")
    p.add_argument(
        "--workers", type=positive_int, default=None,
        help="processes that parse (default: one trace per CPU for traces under 32 MB; two per trace above)",
    )
    p.add_argument("--write-sidecars", action="store_true",
                   help="parse the traces without a matching sidecar and write theirs "
                   "(summaries/<stem>.summary.json)")
    p.add_argument("--shard", metavar="K/N", default=None,
                   help="with --write-sidecars: only the K-th of N stable shares of the traces (0 <= K < N); "
                   "'auto' reads SLURM_PROCID/SLURM_NTASKS, else RANK/WORLD_SIZE")
    p.set_defaults(func=_summary, document=_document)
