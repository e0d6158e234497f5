"""``torchprof pyspy``: sample a training job with py-spy, then read the result.

* ``torchprof pyspy record [-o DIR] [--rate R] [--native] [--idle] -- CMD...`` runs
  ``py-spy record -s -f raw`` around CMD (every process it starts is sampled, e.g. all torchrun
  workers), writing ``DIR/pyspy_<host>[_node<SLURM_NODEID>][_task<SLURM_PROCID>]_<time>_<pid>.txt``
  so that one launcher per node (``srun ... torchprof pyspy record -- torchrun ...``) never
  clobbers another's file, nor a rerun its predecessor's.  Exits with CMD's exit code.
* ``torchprof pyspy report FILE...`` prints where the samples landed: the deepest function of
  each stack and the deepest frame of your own code (or of ``--library-name``) that led there.
* ``torchprof pyspy speedscope FILE... -o OUT.speedscope.json`` writes the stacks as one speedscope
  file: open it at www.speedscope.app (nothing is uploaded) or offline for the flamegraph.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from torchprof_args.capture.flags.types import non_negative_int, positive_int
from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError, ExitStatus

if TYPE_CHECKING:
    from torchprof_args.analysis.pyspy.parse import Profile

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    """Add ``torchprof pyspy record | report | speedscope``."""
    parser = subparsers.add_parser(
        "pyspy",
        help="sample a training job with py-spy; report its output or open it in speedscope",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="pyspy_command", metavar="ACTION", required=True)
    _add_record(sub)
    _add_report(sub)
    _add_speedscope(sub)


def _add_record(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "record",
        help="run CMD under py-spy (all its subprocesses), one raw file per node launcher",
        description="Run CMD under `py-spy record -s -f raw`; exits with CMD's exit code.",
    )
    p.add_argument("-o", "--output-dir", default=os.path.join("prof", "pyspy"), metavar="DIR",
                   help="directory for the raw profiles (created if missing; default prof/pyspy)")
    p.add_argument("--rate", type=positive_int, default=100, metavar="R",
                   help="samples per second per process (default 100)")
    p.add_argument("--native", action="store_true",
                   help="also sample native (C/C++/CUDA runtime) frames; slower")
    p.add_argument("--idle", action="store_true",
                   help="include idle threads (waiting on locks, I/O, the GPU)")
    p.add_argument("--short-filenames", action="store_true",
                   help="let py-spy shorten file names (the report then tells your code from "
                        "libraries less reliably)")
    p.add_argument("profiled", nargs=argparse.REMAINDER, metavar="-- CMD",
                   help="the command to profile, after --")
    p.set_defaults(func=_run_record)


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="table of the functions where most samples landed",
        description="Where the samples landed: one row per stack (or per leaf with "
                    "--aggregate-leaf-paths), with the deepest frame of your code that led there.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="py-spy raw files (-f raw)")
    p.add_argument("--library-name", metavar="NAME",
                   help="attribute each stack to its deepest frame inside this package "
                        "(e.g. megatron, megatron.core, my_project); default: your own code, "
                        "i.e. files outside site-packages and the standard library")
    p.add_argument("--aggregate-leaf-paths", action="store_true",
                   help="merge rows with the same function and library frame reached through "
                        "different call paths")
    p.add_argument("--top", type=non_negative_int, default=20, metavar="N",
                   help="rows to show (0 = all; default 20)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_run_report)


def _add_speedscope(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "speedscope",
        help="the stacks as one speedscope file, for its interactive flamegraph",
        description="Write the stacks of FILE... as one speedscope file (a flamegraph with zoom, "
                    "search and per-function callers/callees): open it at www.speedscope.app, "
                    "which keeps it in the browser, or with an offline copy of speedscope.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="py-spy raw files (-f raw)")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="output file (e.g. flame.speedscope.json)")
    p.add_argument("--title", help="the profile's name in speedscope (default: the file names)")
    p.set_defaults(func=_run_speedscope)


def _run_record(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.pyspy import record

    command = list(args.profiled)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CommandError(
            "give the command to profile after `--`, e.g. "
            "`torchprof pyspy record -o prof/pyspy -- torchrun --nproc-per-node 8 train.py`."
        )
    py_spy = record.find_py_spy()
    if py_spy is None:
        raise CommandError(f"py-spy is not installed; {record.PYSPY_INSTALL_HINT}.", ExitStatus.TOOL_MISSING)
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as err:
        raise CommandError(f"-o/--output-dir {args.output_dir!r} cannot be created "
                           f"({err.strerror or err}).") from None
    try:
        recording = record.start(py_spy, args.output_dir, command, rate=args.rate, native=args.native,
                                 idle=args.idle, full_filenames=not args.short_filenames)
    except OSError as err:
        raise CommandError(f"cannot start py-spy ({py_spy}): {err.strerror or err}.") from None
    return record.finish(recording)


def _load(files: list[str]) -> Profile:
    """The merged profile of ``files``; :class:`CommandError` naming the first missing or unreadable one."""
    from torchprof_args.analysis.pyspy.parse import read_profiles

    for path in files:
        if not os.path.isfile(path):
            raise CommandError(f"{path}: no such file (give py-spy raw files written with -f raw).")
    try:
        profile = read_profiles(files)
    except OSError as err:
        raise CommandError(f"{err.filename or ', '.join(files)}: cannot read "
                           f"({err.strerror or err}).") from None
    if profile.total_samples == 0 and profile.malformed_records:
        raise CommandError(f"{', '.join(files)}: no 'stack COUNT' record, {profile.malformed_records} "
                           "line(s) of something else; give py-spy raw files (py-spy record -f raw, or "
                           "torchprof pyspy record).")
    return profile


def _run_report(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.pyspy.report import format_report, report_document, report_rows

    profile = _load(args.files)
    rows = report_rows(profile, library=args.library_name,
                       aggregate_leaf_paths=args.aggregate_leaf_paths, top=args.top or None)
    if args.json:
        print(json.dumps(report_document(profile, rows, library=args.library_name,
                                         aggregate_leaf_paths=args.aggregate_leaf_paths), indent=2))
    else:
        print(format_report(profile, rows, library=args.library_name))
    return 0


def _run_speedscope(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.pyspy.speedscope import write_speedscope

    profile = _load(args.files)
    if profile.total_samples == 0:
        raise CommandError(f"no samples in {', '.join(args.files)}; nothing to draw.")
    title = args.title or "py-spy: " + ", ".join(os.path.basename(f) for f in args.files)
    try:
        write_speedscope(profile, args.output, title)
    except OSError as err:
        raise CommandError(f"-o/--output {args.output!r} cannot be written "
                           f"({err.strerror or err}).") from None
    print(f"torchprof pyspy: wrote {args.output} ({profile.total_samples} samples); open it at "
          "https://www.speedscope.app", file=sys.stderr)
    for note in profile.problems():
        print(f"Note: {note}", file=sys.stderr)
    return 0
