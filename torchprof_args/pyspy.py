"""``torchprof pyspy``: sample a training job with py-spy, then read the result.

* ``torchprof pyspy record [-o DIR] [--rate R] [--native] [--idle] -- CMD...`` runs
  ``py-spy record -s -f raw`` around CMD (every process it starts is sampled, e.g. all torchrun
  workers), writing ``DIR/pyspy_<host>[_node<SLURM_NODEID>][_task<SLURM_PROCID>]_<time>_<pid>.txt``
  so that one launcher per node (``srun ... torchprof pyspy record -- torchrun ...``) never
  clobbers another's file, nor a rerun its predecessor's.  Exits with CMD's exit code.
* ``torchprof pyspy report FILE...`` prints where the samples landed: the deepest function of
  each stack and the deepest frame of your own code (or of ``--library-name``) that led there.
* ``torchprof pyspy flamegraph FILE... -o out.svg|out.html`` writes an interactive flamegraph.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from torchprof_args.atomic import partial_path

__all__ = ["register", "record_command", "output_name", "find_py_spy"]

PYSPY_INSTALL_HINT = "install it with `pip install 'torchprof-args[pyspy]'` (or `pip install py-spy`)"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pyspy",
        help="sample a training job with py-spy; report and flamegraph its output",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="pyspy_command", metavar="ACTION", required=True)

    record = sub.add_parser(
        "record",
        help="run CMD under py-spy (all its subprocesses), one raw file per node launcher",
        description="Run CMD under `py-spy record -s -f raw`; exits with CMD's exit code.",
    )
    record.add_argument("-o", "--output-dir", default=os.path.join("prof", "pyspy"), metavar="DIR",
                        help="directory for the raw profiles (created if missing; default prof/pyspy)")
    record.add_argument("--rate", type=_positive_int, default=100, metavar="R",
                        help="samples per second per process (default 100)")
    record.add_argument("--native", action="store_true",
                        help="also sample native (C/C++/CUDA runtime) frames; slower")
    record.add_argument("--idle", action="store_true",
                        help="include idle threads (waiting on locks, I/O, the GPU)")
    record.add_argument("--short-filenames", action="store_true",
                        help="let py-spy shorten file names (the report then tells your code from "
                             "libraries less reliably)")
    record.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD",
                        help="the command to profile, after --")
    record.set_defaults(func=_run_record)

    report = sub.add_parser(
        "report",
        help="table of the functions where most samples landed",
        description="Where the samples landed: one row per stack (or per leaf with "
                    "--aggregate-leaf-paths), with the deepest frame of your code that led there.",
    )
    report.add_argument("files", nargs="+", metavar="FILE", help="py-spy raw files (-f raw)")
    report.add_argument("--library-name", metavar="NAME",
                        help="attribute each stack to its deepest frame inside this package "
                             "(e.g. megatron, megatron.core, my_project); default: your own code, "
                             "i.e. files outside site-packages and the standard library")
    report.add_argument("--aggregate-leaf-paths", action="store_true",
                        help="merge rows with the same function and library frame reached through "
                             "different call paths")
    report.add_argument("--top", type=_non_negative_int, default=20, metavar="N",
                        help="rows to show (0 = all; default 20)")
    report.add_argument("--json", action="store_true", help="print JSON instead of a table")
    report.set_defaults(func=_run_report)

    flame = sub.add_parser(
        "flamegraph",
        help="interactive flamegraph (SVG or HTML), generated locally",
        description="Write an interactive flamegraph: click to zoom, hover for details, search.",
    )
    flame.add_argument("files", nargs="+", metavar="FILE", help="py-spy raw files (-f raw)")
    flame.add_argument("-o", "--output", required=True, metavar="OUT",
                       help="output file: .svg (SVG with embedded script) or .html")
    flame.add_argument("--title", help="title shown above the graph (default: the file names)")
    flame.set_defaults(func=_run_flamegraph)


def _positive_int(text: str) -> int:
    from torchprof_args.flags import positive_int

    return positive_int(text)


def _non_negative_int(text: str) -> int:
    from torchprof_args.flags import non_negative_int

    return non_negative_int(text)


def _error(message: str) -> int:
    print(f"torchprof pyspy: {message}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------------------------
# record


def find_py_spy() -> str | None:
    """The py-spy executable: on PATH, else next to this interpreter (an unactivated venv)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def output_name(now: datetime.datetime | None = None, pid: int | None = None,
                env: dict[str, str] | None = None, host: str | None = None) -> str:
    """``pyspy_<host>[_node<N>][_task<P>]_<YYYYmmdd-HHMMSS>_<pid>.txt``.

    ``SLURM_NODEID`` (else ``NODE_RANK``/``GROUP_RANK``) tells nodes apart, ``SLURM_PROCID``
    launchers on one node, the time and pid reruns.
    """
    env = os.environ if env is None else env
    host = (host or socket.gethostname()).split(".")[0] or "host"
    parts = ["pyspy", _safe(host)]
    node = env.get("SLURM_NODEID") or env.get("NODE_RANK") or env.get("GROUP_RANK")
    if node:
        parts.append(f"node{_safe(node)}")
    task = env.get("SLURM_PROCID")
    if task:
        parts.append(f"task{_safe(task)}")
    parts.append((now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S"))
    parts.append(str(os.getpid() if pid is None else pid))
    return "_".join(parts) + ".txt"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text)


def record_command(py_spy: str, output: str, status_file: str, command: list[str], rate: int = 100,
                   native: bool = False, idle: bool = False, full_filenames: bool = True) -> list[str]:
    """The py-spy command line: CMD runs under the exit-code launcher, sampled with ``-s``."""
    argv = [py_spy, "record", "-s", "-f", "raw", "-r", str(rate), "-o", output]
    if full_filenames:
        argv.append("--full-filenames")
    if native:
        argv.append("--native")
    if idle:
        argv.append("--idle")
    launcher = str(Path(__file__).with_name("_pyspy_child.py"))
    return [*argv, "--", sys.executable, launcher, status_file, "--", *command]


def _run_record(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return _error(
            "give the command to profile after `--`, e.g. "
            "`torchprof pyspy record -o prof/pyspy -- torchrun --nproc-per-node 8 train.py`."
        )
    py_spy = find_py_spy()
    if py_spy is None:
        return _error(f"py-spy is not installed; {PYSPY_INSTALL_HINT}.")
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as err:
        return _error(f"-o/--output-dir {args.output_dir!r} cannot be created ({err.strerror or err}).")
    final = os.path.join(args.output_dir, output_name())
    partial = str(partial_path(final))
    status_file = os.path.join(args.output_dir, f".{os.path.basename(final)}.status")
    argv = record_command(py_spy, partial, status_file, command, rate=args.rate, native=args.native,
                          idle=args.idle, full_filenames=not args.short_filenames)
    try:
        spy = subprocess.Popen(argv)
    except OSError as err:
        return _error(f"cannot start py-spy ({py_spy}): {err.strerror or err}.")

    # Ctrl-C reaches py-spy (which then writes its file) and the command by themselves; we wait.
    # A SIGTERM sent to us alone (a job script's `kill`) asks py-spy to stop and write.
    interrupted: list[int] = []

    def on_term(signum: int, _frame: object) -> None:
        interrupted.append(signum)
        spy.send_signal(signal.SIGINT)

    previous_int = signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum))
    previous_term = signal.signal(signal.SIGTERM, on_term)
    try:
        spy_code = spy.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)

    child_code = _read_status(status_file)
    if os.path.exists(partial) and os.path.getsize(partial) > 0:
        os.replace(partial, final)
        print(f"torchprof pyspy: wrote {final}\n  report:     torchprof pyspy report {final}\n"
              f"  flamegraph: torchprof pyspy flamegraph {final} -o {final[:-4]}.svg", file=sys.stderr)
    else:
        if os.path.exists(partial):
            os.remove(partial)
        print(f"torchprof pyspy: py-spy wrote no samples (py-spy exit code {spy_code}).", file=sys.stderr)
    if child_code is None:
        # The launcher did not finish: py-spy was interrupted (it then kills what it started),
        # could not start it, or died.
        if interrupted:
            return 128 + interrupted[0]
        return spy_code if spy_code != 0 else 1
    return child_code


def _read_status(path: str) -> int | None:
    try:
        with open(path) as handle:
            code = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    finally:
        for leftover in (path, f"{path}.partial"):
            if os.path.exists(leftover):
                os.remove(leftover)
    return code


# ---------------------------------------------------------------------------------------------
# report / flamegraph


def _load(files: list[str]):
    from torchprof_args._pyspy_parse import read_profiles

    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file (give py-spy raw files written with -f raw).")
    return read_profiles(files)


def _run_report(args: argparse.Namespace) -> int:
    from torchprof_args._pyspy_parse import format_table, report_rows

    try:
        profile = _load(args.files)
    except OSError as err:
        return _error(str(err))
    rows = report_rows(profile, library=args.library_name,
                       aggregate_leaf_paths=args.aggregate_leaf_paths, top=args.top or None)
    if args.json:
        print(json.dumps({
            "files": profile.files,
            "total_samples": profile.total_samples,
            "library_name": args.library_name,
            "aggregate_leaf_paths": args.aggregate_leaf_paths,
            "unparsed_frames": profile.unparsed_frames,
            "unparsed_frame_samples": profile.unparsed_frame_samples,
            "malformed_records": profile.malformed_records,
            "rows": [row.as_dict() for row in rows],
        }, indent=2))
        return 0
    if profile.total_samples == 0:
        print(f"No samples in {', '.join(profile.files)} (was the program shorter than one sampling "
              "interval, or only idle without --idle?).")
    else:
        print(format_table(rows))
        print(f"\n{profile.total_samples} samples in {len(profile.files)} file(s); "
              f"library frames: {args.library_name or 'your own code'}.")
    for note in profile.problems():
        print(f"Note: {note}")
    return 0


def _run_flamegraph(args: argparse.Namespace) -> int:
    from torchprof_args._flamegraph import write_flamegraph

    if not args.output.lower().endswith((".svg", ".html", ".htm")):
        return _error(f"-o/--output {args.output!r}: name it .svg or .html.")
    try:
        profile = _load(args.files)
    except OSError as err:
        return _error(str(err))
    if profile.total_samples == 0:
        return _error(f"no samples in {', '.join(args.files)}; nothing to draw.")
    title = args.title or "py-spy: " + ", ".join(os.path.basename(f) for f in args.files)
    samples = write_flamegraph(profile.stacks, args.output, title)
    print(f"torchprof pyspy: wrote {args.output} ({samples} samples)", file=sys.stderr)
    for note in profile.problems():
        print(f"Note: {note}", file=sys.stderr)
    return 0
