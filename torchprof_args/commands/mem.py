"""``torchprof mem PATH...``: where the memory goes and why it ran out.

    torchprof mem prof/                       # the latest cycle of a run folder (+ its OOM snapshots)
    torchprof mem prof/iter000120-000121/     # one cycle: every rank's peak, the outliers
    torchprof mem rank0.pt.trace.json.gz      # one trace
    torchprof mem memory_snapshot_..._oom.pickle --json

For a trace, a cycle or a run folder (its latest cycle, or --cycle): the peak by category
(parameter, gradient, optimizer state, activation, temporary, other), when it happens (step, phase,
operator, module, call site), the timeline, the outlier ranks with their pipeline stage and
parallel coordinates, and findings ranked by the bytes they would free, each with its remedy.
Categories come from the trace's summary sidecar (PyTorch's own categorisation, computed when the
trace was published with --torch-profile-profile-memory --torch-profile-record-shapes
--torch-profile-with-stack) or, without one, from the trace itself.  For a CUDA memory snapshot
(read without running its code): the allocator's state, fragmentation, and for an _oom.pickle the
failed request explained.  --json: the versioned schema of docs/guides/out-of-memory.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args.capture.flags.types import positive_int
from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError, ExitStatus, TraceError
from torchprof_args.naming import METRICS_FILENAME

if TYPE_CHECKING:
    from torchprof_args.analysis.collect.trace_results import TraceFailure

__all__ = ["register"]

#: where the snapshotter writes in a run folder (``runtime/memory_snapshots.py``).
SNAPSHOT_FOLDER = "memory_snapshots"


def _split_inputs(paths: list[str]) -> tuple[list[Path], list[str | Path]]:
    """Snapshots (``.pickle`` files, and a run folder's OOM snapshots) and the other inputs."""
    snapshots: list[Path] = []
    others: list[str | Path] = []
    for name in paths:
        path = Path(name)
        if path.suffix == ".pickle" or path.name.endswith(".pickle.gz"):
            snapshots.append(path)
            continue
        others.append(name)
        if path.is_dir():
            snapshots += sorted((path / SNAPSHOT_FOLDER).glob("*_oom.pickle"))
    return snapshots, others


def _traces(inputs: list[str | Path],
            args: argparse.Namespace) -> tuple[list[tuple[str, Any]], str | None, list[TraceFailure]]:
    """Each trace's memory part (file, part) of the chosen cycle, its label, and the failures."""
    from torchprof_args.analysis.collect.discover import choose_cycle, expand
    from torchprof_args.analysis.collect.pool import collect
    from torchprof_args.analysis.collect.trace_results import MEMORY, Failure, TraceFailure

    if not inputs:
        return [], None, []
    try:
        files, label = choose_cycle(expand(inputs), args.cycle)
    except TraceError as err:  # a run folder of snapshots or metrics only: not an error unless nothing is
        return [], None, [TraceFailure(Failure.NO_TRACES, None, str(err))]
    got = collect(files, parts=(MEMORY,), reparse=args.reparse, workers=args.workers,
                  progress=not args.no_progress)
    return got.memory, label, got.errors


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s document (plain JSON values) and the exit status: what ``torchprof mcp`` returns."""
    import msgspec

    from torchprof_args.analysis.collect.trace_results import Failure, TraceFailure
    from torchprof_args.analysis.decode.loader import release_memory_eagerly
    from torchprof_args.analysis.jsonout import finite
    from torchprof_args.analysis.memory.allocator import allocator_view
    from torchprof_args.analysis.memory.report import memory_report
    from torchprof_args.analysis.memory.snapshot import load_snapshot, summarize_snapshot

    release_memory_eagerly()
    snapshot_paths, others = _split_inputs(args.paths)
    parts, label, failures = _traces(others, args)
    allocator = next((found for found in (allocator_view(Path(p) / METRICS_FILENAME) for p in others
                                          if Path(p).is_dir()) if found is not None), None)
    snapshots = []
    for path in snapshot_paths:
        try:
            snapshots.append(summarize_snapshot(load_snapshot(path), str(path), top=args.top))
        except TraceError as err:
            failures.append(TraceFailure(Failure.INVALID, path, str(err)))
    if not parts and not snapshots and allocator is None:
        raise CommandError(str(failures[0]) if len(failures) == 1 else
                           f"none of the inputs could be read ({'; '.join(map(str, failures[:3]))})")
    errors = [str(f) for f in failures if f.kind is not Failure.NO_TRACES]
    for error in errors:
        print(f"torchprof mem: {error}", file=sys.stderr)
    report = memory_report(" ".join(args.paths), label, parts, snapshots, errors, allocator)
    return finite(msgspec.to_builtins(report)), ExitStatus.PARTLY_FAILED if errors else ExitStatus.OK


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.jsonout import print_json
    from torchprof_args.analysis.render.memory import format_memory_report

    doc, status = _document(args)
    if args.json:
        print_json(doc)
    else:
        print(format_memory_report(doc, rows=args.top), end="")
    return status


def register(subparsers: Subparsers) -> None:
    """Add ``torchprof mem``."""
    p = subparsers.add_parser(
        "mem", help="where the memory goes and why it ran out: traces, cycles, run folders, snapshots",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="trace files, cycle or run folders, or memory snapshot .pickle files")
    p.add_argument("--cycle", type=int, default=None, metavar="ITER",
                   help="the cycle whose traces start at this iteration (default: the latest)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: version, path, ranks, peak, findings (largest first), ...")
    p.add_argument("--top", type=positive_int, default=10, help="findings and sites listed (default 10)")
    p.add_argument("--reparse", action="store_true", help="parse the traces even where a sidecar matches")
    p.add_argument("--workers", type=positive_int, default=None, help="processes that parse traces")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run, document=_document)
