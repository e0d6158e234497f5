"""``torchprof nsys -- CMD``: the Nsight Systems command that captures the ``--torch-profile-nsys`` steps.

The training side (:mod:`torchprof_args.capture.runtime.nsys`) calls ``cudaProfilerStart/Stop`` around
the recorded steps; this command prints (or ``--run``\\ s) the ``nsys profile
--capture-range=cudaProfilerApi --capture-range-end=stop ...`` line that matches it, with
per-node output names.  Import-light.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys

from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError, ExitStatus

__all__ = ["nsys_command", "register"]


def _node_token(env: dict[str, str], placeholders: bool) -> str | None:
    """Which node launcher this is: SLURM's node id, else ``NODE_RANK``/``GROUP_RANK``."""
    for name in ("SLURM_NODEID", "NODE_RANK", "GROUP_RANK"):
        if name in env:
            return f"%q{{{name}}}" if placeholders else env[name]
    return None


def nsys_command(command: list[str], output_dir: str = "prof/nsys", trace: str = "cuda,nvtx,osrt",
                 mpi: bool = False, capture_range_end: str = "stop", extra: list[str] | None = None,
                 placeholders: bool = True, env: dict[str, str] | None = None,
                 host: str | None = None, nsys: str = "nsys") -> list[str]:
    """The ``nsys profile`` command line that captures the ``--torch-profile-nsys`` steps.

    Output names are per node: ``<dir>/nsys_<host>_node<id>_<pid>``.  With ``placeholders``
    (for a printed command that will run on other nodes) host and node id are nsys's own
    ``%h`` and ``%q{SLURM_NODEID}``; otherwise this machine's values.  ``%p`` (the launcher's
    pid) keeps reruns and several launchers per node apart.
    """
    env = dict(os.environ) if env is None else env
    traces = trace.split(",")
    if mpi and "mpi" not in traces:
        traces.append("mpi")
    host_part = "%h" if placeholders else (host or socket.gethostname()).split(".")[0]
    parts = ["nsys", host_part]
    node = _node_token(env, placeholders)
    if node is not None:
        parts.append(f"node{node}")
    parts.append("%p")
    output = os.path.join(output_dir, "_".join(parts))
    argv = [
        nsys, "profile",
        "-t", ",".join(traces),
        "--capture-range=cudaProfilerApi",
        f"--capture-range-end={capture_range_end}",
        "--cuda-memory-usage=true",
        "-o", output,
    ]
    for item in extra or []:
        argv += shlex.split(item)
    return [*argv, *command]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "nsys",
        help="print (or run) the nsys command that captures the --torch-profile-nsys steps",
        description=(
            "Print the `nsys profile` command that captures exactly the steps recorded with "
            "--torch-profile-nsys (cudaProfilerApi capture range), or run it with --run."
        ),
    )
    parser.add_argument("--output-dir", default=os.path.join("prof", "nsys"), metavar="DIR",
                        help="where nsys writes its .nsys-rep files (default prof/nsys)")
    parser.add_argument("--trace", default="cuda,nvtx,osrt", metavar="APIS",
                        help="nsys -t value (default cuda,nvtx,osrt)")
    parser.add_argument("--mpi", action="store_true", help="also trace MPI (adds mpi to -t)")
    parser.add_argument("--capture-range-end", default="stop", metavar="MODE",
                        help="nsys --capture-range-end: stop (default: the first recorded cycle "
                             "only), repeat[:N] (one report per cycle), repeat-shutdown:N")
    parser.add_argument("--extra", action="append", default=[], metavar="ARG",
                        help="more nsys arguments, shell-quoted; repeatable; write "
                             "--extra=--gpu-metrics-devices=all (with '=') for values starting with -")
    parser.add_argument("--run", action="store_true", help="run the command instead of printing it")
    parser.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- CMD",
                        help="the launch command (e.g. torchrun ... train.py --torch-profile-nsys)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    command = list(args.launch)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CommandError("give the launch command after `--`, e.g. `torchprof nsys -- torchrun "
                           "--nproc-per-node 8 train.py --torch-profile --torch-profile-nsys`.")
    if not args.run:
        print(shlex.join(nsys_command(command, args.output_dir, args.trace, args.mpi,
                                      args.capture_range_end, args.extra, placeholders=True)))
        return 0
    nsys = shutil.which("nsys")
    if nsys is None:
        raise CommandError("--run needs Nsight Systems' `nsys` on PATH (e.g. module load nsight-systems, or "
                           "/usr/local/cuda/bin); without --run the command is only printed.",
                           ExitStatus.TOOL_MISSING)
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as err:
        raise CommandError(f"--output-dir {args.output_dir!r} cannot be created "
                           f"({err.strerror or err}).") from None
    argv = nsys_command(command, args.output_dir, args.trace, args.mpi, args.capture_range_end,
                        args.extra, placeholders=False, nsys=nsys)
    print(f"torchprof nsys: {shlex.join(argv)}", file=sys.stderr)
    return subprocess.call(argv)
