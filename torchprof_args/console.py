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
    "torchprof_args.commands.flags",
    "torchprof_args.commands.trace_tools",
    "torchprof_args.commands.collectives",
    "torchprof_args.commands.hang",
    "torchprof_args.commands.diagnose",
    "torchprof_args.commands.pyspy",
    "torchprof_args.commands.nsys",
    "torchprof_args.commands.dashboard",
    "torchprof_args.commands.goodput",
    "torchprof_args.commands.trend",
    "torchprof_args.commands.trigger",
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
