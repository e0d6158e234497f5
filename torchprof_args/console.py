"""The ``torchprof`` command line: one sub-command per feature module.

Each module in :data:`COMMAND_MODULES` exposes ``register(subparsers)`` that adds its
sub-commands and sets ``func`` (``args -> int`` exit code) as the parser default.  Modules must
be import-light (no torch, wandb, deepspeed or megatron at import time) so that every
``torchprof`` invocation starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: tuple[str, ...] = (
    "torchprof_args.flags.command",
    "torchprof_args.analysis.commands",
    "torchprof_args.analysis.collectives_command",
    "torchprof_args.analysis.hang_command",
    "torchprof_args.analysis.diagnose_command",
    "torchprof_args.pyspy.command",
    "torchprof_args.runtime.nsys_command",
    "torchprof_args.metrics.dashboard_command",
    "torchprof_args.ondemand.trigger",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchprof",
        description="torchprof-args: profiling for large-model training jobs.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``torchprof``; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("torchprof: interrupted", file=sys.stderr)
        return 130
