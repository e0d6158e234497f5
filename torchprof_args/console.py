"""The ``torchprof`` command line: one sub-command per feature module.

Each module in :data:`COMMAND_MODULES` exposes ``register(subparsers)`` that adds its
sub-commands and sets ``func`` (``args -> int`` exit status) as the parser default.  The parser
itself is the ``command_line`` default of every command (``torchprof flags --update-docs``
documents it).

Errors have one path: a command raises :class:`~torchprof_args.errors.CommandError` (message and
exit status); :func:`main` alone prints it, as ``torchprof <command>: error: <message>``, and
returns its status (:data:`EXIT_STATUSES`).  Output cut short by a closed pipe (``| head``) ends
quietly here too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Protocol

from torchprof_args.commands import (
    brief,
    collectives,
    critical_path,
    dashboard,
    diagnose,
    flags,
    goodput,
    hang,
    mcp,
    mem,
    nsys,
    pyspy,
    trace_tools,
    trend,
    trigger,
)
from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError, ExitStatus

__all__ = ["COMMAND_MODULES", "EXIT_STATUSES", "CommandModule", "build_parser", "main"]


class CommandModule(Protocol):
    """A feature's command module: it adds its sub-commands to ``torchprof``."""

    def register(self, subparsers: Subparsers) -> None: ...


#: One module per feature, in ``--help``'s order; each imported here, light (no torch, wandb,
#: deepspeed or megatron at import time), so that every ``torchprof`` invocation starts fast.
COMMAND_MODULES: tuple[CommandModule, ...] = (
    flags, trace_tools, mem, collectives, hang, diagnose, critical_path, pyspy, nsys, dashboard, goodput,
    trend, trigger, brief, mcp,
)

#: The exit-status convention of every command (:class:`~torchprof_args.errors.ExitStatus`), as
#: ``torchprof --help`` and docs/reference/commands.md say it.
EXIT_STATUSES = """\
exit status, the same in every command:
  0    done
  1    it ran, but part of the work failed: some of several traces could not be read (the
       others are reported); a job rejected the request, did not answer in time or stopped
  2    it cannot run as asked: a bad argument or value, a path that does not exist, an input
       that is not what the command reads (one line says what to do: torchprof COMMAND: error: ...)
  3    a CI gate failed, after the report is printed: trend --fail-on-regression found a
       regression, diff --fail-above PCT a step or operator slower by more than PCT (the error
       line names them)
  127  the tool it runs is not installed (nsys --run, pyspy record)
  130  interrupted (Ctrl-C)
  pyspy record and nsys --run otherwise exit with the status of the command they ran."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchprof",
        description="torchprof-args: profiling for large-model training jobs.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    # roots: the folders a command may read beyond its arguments (a metrics.jsonl found beside the
    # traces); torchprof mcp sets its roots, None elsewhere: any
    parser.set_defaults(command_line=parser, roots=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``torchprof``; returns the exit status (see :data:`EXIT_STATUSES`)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CommandError as err:
        print(f"torchprof {args.command}: error: {err}", file=sys.stderr)
        return err.status
    except BrokenPipeError:  # the reader (| head) is gone: nothing more to say, to anyone
        _silence_stdout()
        return ExitStatus.OK
    except KeyboardInterrupt:
        print("torchprof: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
