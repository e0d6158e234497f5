"""``torchprof summary | split | merge | report | mem``: the trace toolkit's command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchprof_args.errors import TraceError


def _expand(inputs: list[str]) -> tuple[list[Path], bool]:
    """Trace files named directly or found in directories; True when a directory was given."""
    from torchprof_args.analysis.merge import trace_files

    files: list[Path] = []
    had_dir = False
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            had_dir = True
            files += trace_files(p)
        elif not p.exists():
            raise TraceError(f"{p}: no such file or directory")
        else:
            files.append(p)
    return files, had_dir


def _summary(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.analyzers.cross_rank import cross_rank
    from torchprof_args.analysis.loader import load_trace, release_memory_eagerly
    from torchprof_args.analysis.summary import finite, summarize
    from torchprof_args.analysis.text import format_cross_rank, format_summary

    release_memory_eagerly()
    files, had_dir = _expand(args.traces)
    summaries = []
    for f in files:
        s = finite(summarize(load_trace(f, progress=not args.no_progress, workers=args.workers), top=args.top))
        summaries.append(s)
        if args.json:
            print(json.dumps(s))
        else:
            print(format_summary(s, rows=args.rows))
        sys.stdout.flush()
    if len(summaries) > 1 or had_dir:
        view = finite(cross_rank(summaries))
        if args.json:
            print(json.dumps({"cross_rank": view}))
        else:
            print(format_cross_rank(view))
    return 0


def _split(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.split import split_trace

    if args.max_mb <= 0:
        raise TraceError(f"--max-mb must be a positive number of megabytes, got {args.max_mb:g}")
    pieces = split_trace(args.trace, args.max_mb, args.output, progress=not args.no_progress)
    for p in pieces:
        print(f"{p}\t{p.stat().st_size / 1e6:.2f} MB")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.merge import merge_traces

    result = merge_traces(args.directory, args.output, progress=not args.no_progress)
    events = ", ".join(f"rank {r}: {n:,}" for r, n in sorted(result["ranks"].items()))
    print(f"wrote {result['output']} ({events} events)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.analyzers.cross_rank import cross_rank
    from torchprof_args.analysis.loader import load_trace, release_memory_eagerly
    from torchprof_args.analysis.report import write_report
    from torchprof_args.analysis.summary import finite, summarize

    release_memory_eagerly()
    files, _ = _expand(args.traces)
    summaries = [finite(summarize(load_trace(f, progress=not args.no_progress), top=args.top)) for f in files]
    out = write_report(summaries, finite(cross_rank(summaries)), args.output)
    print(f"wrote {out}")
    return 0


def _mem(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.memsnap import format_snapshot, load_snapshot, summarize_snapshot

    summary = summarize_snapshot(load_snapshot(args.snapshot), top=args.top)
    print(json.dumps(summary) if args.json else format_snapshot(summary, args.snapshot))
    return 0


def _guard(func: Callable[[argparse.Namespace], int], name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except TraceError as exc:
            print(f"torchprof {name}: error: {exc}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            return 0

    return run


def register(subparsers: Any) -> None:
    """Add the trace toolkit's sub-commands to ``torchprof``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--no-progress", action="store_true", help="no progress bars")

    p = subparsers.add_parser(
        "summary", parents=[common], help="per-rank summary of Kineto traces (HTA-comparable GPU numbers)",
        description="Summarise traces: steps, GPU idle/compute/communication/overlap (HTA definitions), "
        "top kernels and CPU operators, memory; a cross-rank view for several ranks.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE_OR_DIR", help=".json/.json.gz trace files or directories of them")
    p.add_argument("--json", action="store_true", help="one JSON object per trace (then one cross_rank object)")
    p.add_argument("--top", type=int, default=30, help="entries in the top-N lists (default 30)")
    p.add_argument("--rows", type=int, default=10, help="rows per table in the text output (default 10)")
    p.add_argument(
        "--workers", type=int, default=None,
        help="decode with N processes (default: 2 for files over 32 MB when 2 cores are usable, else 1)",
    )
    p.set_defaults(func=_guard(_summary, "summary"))

    p = subparsers.add_parser(
        "split", parents=[common], help="cut a huge trace into standalone traces of at most N MB",
        description="Split by ProfilerStep (and by time inside oversized steps); every piece keeps the metadata.",
    )
    p.add_argument("trace", help=".json/.json.gz trace file")
    p.add_argument("--max-mb", type=float, required=True, help="largest piece, in MB of JSON")
    p.add_argument("-o", "--output", default=None, help="output directory (default: TRACE's name + .split)")
    p.set_defaults(func=_guard(_split, "split"))

    p = subparsers.add_parser(
        "merge", parents=[common], help="merge per-rank traces into one timeline with 'rank N' tracks",
        description="Merge the traces of a directory, aligning clocks with baseTimeNanoseconds.",
    )
    p.add_argument("directory", help="directory of per-rank .json/.json.gz traces")
    p.add_argument("-o", "--output", required=True, help="merged trace (.json or .json.gz)")
    p.set_defaults(func=_guard(_merge, "merge"))

    p = subparsers.add_parser(
        "report", parents=[common], help="self-contained HTML report for a directory of rank traces",
        description="Write an HTML report with inline SVG plots: step time per rank, kernel types, idle, "
        "overlap, top kernels, stragglers.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE_OR_DIR")
    p.add_argument("-o", "--output", required=True, help="report .html to write")
    p.add_argument("--top", type=int, default=30)
    p.set_defaults(func=_guard(_report, "report"))

    p = subparsers.add_parser(
        "mem", help="summarise a torch.cuda.memory._dump_snapshot pickle (safely)",
        description="Peak, reserved vs allocated, fragmentation and top allocation sites of a memory "
        "snapshot; the pickle is read with an unpickler that cannot run code.",
    )
    p.add_argument("snapshot", help="snapshot .pickle file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--top", type=int, default=15)
    p.set_defaults(func=_guard(_mem, "mem"))
