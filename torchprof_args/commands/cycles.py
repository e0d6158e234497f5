"""Summaries per profiled cycle: what ``torchprof summary | report | diff`` show.

:func:`cycle_summaries` expands the command's inputs into trace files
(:mod:`torchprof_args.analysis.collect.discover`), gets each one's summary (its sidecar, else
parsed: :mod:`torchprof_args.analysis.collect`) and groups them by cycle.  A trace that fails is
reported on stderr in one line and left out; none readable is an error.  :func:`cycle_results`: one
cycle's parts, the same way (``diagnose``, ``critical-path``, ``collectives``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from torchprof_args.analysis.collect.discover import Cycle, choose_cycle, expand, group_by_cycle
from torchprof_args.analysis.collect.pool import Collected, collect
from torchprof_args.analysis.collect.trace_results import Part
from torchprof_args.analysis.decode.loader import release_memory_eagerly
from torchprof_args.analysis.summary import Summary
from torchprof_args.errors import CommandError
from torchprof_args.shared import formats

__all__ = ["cycle_results", "cycle_summaries"]


def cycle_summaries(inputs: list[str | Path], args: argparse.Namespace, top: int | None
                    ) -> tuple[list[tuple[Cycle, list[Summary]]], Collected]:
    """(cycle, its summaries) for every cycle of ``inputs``, and the :class:`Collected` record.

    ``args``: the command's options (``command``, ``reparse``, ``no_progress``, ``workers``).
    """
    release_memory_eagerly()
    files = expand(inputs)
    got = collect(files, top=top, reparse=args.reparse, workers=getattr(args, "workers", None),
                  progress=not args.no_progress)
    _report_errors(got, len(files), args.command)
    by_file = {str(f): s for f, s in zip(files, got.summaries, strict=True)}
    cycles = []
    for cycle in group_by_cycle(files):
        summaries = [s for f in cycle.files if (s := by_file[str(f)]) is not None]
        if summaries:
            cycles.append((cycle, summaries))
    if len(files) > 1 and got.parsed and not got.errors:
        _note_parsing(got, args.command)
    _note_other_versions(got, args.command)
    return cycles, got


def _report_errors(got: Collected, n_files: int, command: str) -> None:
    """One stderr line per trace that failed; :class:`CommandError` when none could be read."""
    if not any(s is not None for s in got.summaries):
        if len(got.errors) == 1:
            raise CommandError(str(got.errors[0]))
        for error in got.errors:
            print(f"torchprof {command}: {error}", file=sys.stderr)
        raise CommandError(f"none of the {n_files} traces could be read")
    for error in got.errors:
        print(f"torchprof {command}: {error}", file=sys.stderr)


def cycle_results(inputs: list[str | Path], args: argparse.Namespace, parts: Sequence[Part]
                  ) -> tuple[str | None, Collected]:
    """One cycle's label (``args.cycle``, else the latest) and its traces' ``parts``; a trace that
    fails is one line on stderr, :class:`CommandError` when none could be read."""
    release_memory_eagerly()
    files, label = choose_cycle(expand(inputs), args.cycle)
    got = collect(files, parts=parts, reparse=args.reparse, workers=args.workers,
                  progress=not args.no_progress)
    if all(r is None for r in got.results):
        raise CommandError(str(got.errors[0]) if len(got.errors) == 1 else
                           f"none of the {len(files)} traces could be read ({got.errors[0]})")
    for error in got.errors:
        print(f"torchprof {args.command}: {error}", file=sys.stderr)
    _note_other_versions(got, args.command)
    return label, got


def _note_parsing(got: Collected, command: str) -> None:
    """Say how many traces were parsed and that sidecars would spare it next time."""
    print(f"torchprof {command}: {got.from_sidecars} summaries read from sidecars, {got.parsed} trace(s) "
          f"parsed ({got.parsed_bytes / 1e6:,.0f} MB in {got.parse_seconds:.1f} s); "
          f"`torchprof summary --write-sidecars` keeps them for next time", file=sys.stderr)


def _note_other_versions(got: Collected, command: str) -> None:
    """One line when sidecars of another torchprof-args version were passed over (their traces parsed)."""
    if got.other_versions:
        versions = ", ".join(str(v) for v in sorted(got.other_versions))
        print(f"torchprof {command}: {sum(got.other_versions.values())} trace(s) parsed again: their "
              f"sidecars were written by another version of torchprof-args (sidecar version {versions}, "
              f"this one reads {formats.SIDECAR.version}); "
              "`torchprof summary --write-sidecars` rewrites them",
              file=sys.stderr)
