"""Megatron-LM's ``extra_args_provider``: every torchprof flag on Megatron's parser, checked as soon
as Megatron has parsed them (before it validates its own arguments or builds anything)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from torchprof_args.capture.config import add_torch_profile_args, validate_args
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.log import get_logger

if TYPE_CHECKING:  # imported when used: parsing Megatron's flags must not import torch
    from torchprof_args.capture.runtime.profiler import TorchProfiler

__all__ = ["ArgsProvider", "check_megatron_args", "check_parsed_args", "compose_args_providers",
           "extra_args_provider", "profiler_from_args"]

logger = get_logger(__name__)

ArgsProvider = Callable[[argparse.ArgumentParser], "argparse.ArgumentParser | None"]

_CHECKED_PARSER = "_torchprof_args_checks"


def extra_args_provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Megatron-LM ``extra_args_provider``: adds the torchprof flag groups (profiler, timers, ...).

    The flags are also checked right after the parser parses them (:func:`check_parsed_args`), i.e.
    when Megatron parses its arguments, before it validates them or builds the model: a bad
    combination exits 2 with a one-line ``error:`` (argparse style) on every rank.

    Args:
        parser: Megatron's parser.

    Returns:
        The same parser.
    """
    parser = add_torch_profile_args(parser)
    _check_when_parsed(parser)
    return parser


def check_parsed_args(args: argparse.Namespace) -> None:
    """Every torchprof check plus the ones against Megatron's own profiling flags (rank flags against
    ``$WORLD_SIZE``).

    Args:
        args: Megatron's parsed namespace.

    Raises:
        TorchProfileArgsError: one line naming the flags.
    """
    check_megatron_args(args)
    if getattr(args, "torch_profile", None) is not None:
        validate_args(args)


def _check_when_parsed(parser: argparse.ArgumentParser) -> None:
    """Wrap this parser object's ``parse_known_args`` (``parse_args`` goes through it too)."""
    if getattr(parser, _CHECKED_PARSER, False):
        return
    original = parser.parse_known_args

    def parse_known_args(args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = original(args, namespace)
        try:
            check_parsed_args(parsed)
        except TorchProfileArgsError as err:  # argparse's status and prefix, without Megatron's long usage
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        return parsed, extras

    # this one parser object's method, wrapped (typeshed's is overloaded on the namespace's type)
    parser.parse_known_args = parse_known_args  # type: ignore[method-assign, assignment]
    setattr(parser, _CHECKED_PARSER, True)


def compose_args_providers(*providers: ArgsProvider | None) -> ArgsProvider:
    """One ``extra_args_provider`` out of several.

    Args:
        providers: applied in order; None entries are skipped; each may return the parser
            (Megatron's convention) or None.

    Returns:
        The composed provider.
    """

    def provider(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for each in providers:
            if each is not None:
                result = each(parser)
                parser = parser if result is None else result
        return parser

    return provider


def check_megatron_args(args: argparse.Namespace) -> None:
    """Refuse combinations with Megatron's own profiling: ``--profile --use-pytorch-profiler`` (both
    would drive torch.profiler); warn on ``--profile`` (nsys ranges share CUPTI).

    :func:`extra_args_provider` runs it when Megatron parses its arguments; :class:`TrainingHook`
    again when it is built (for loops that parse their arguments otherwise).

    Args:
        args: Megatron's parsed namespace.

    Raises:
        TorchProfileArgsError: the combination, and what to drop.
    """
    if not getattr(args, "torch_profile", False) or not getattr(args, "profile", False):
        return
    if getattr(args, "use_pytorch_profiler", False):
        raise TorchProfileArgsError(
            "--torch-profile cannot run together with Megatron's --profile --use-pytorch-profiler: "
            "both drive torch.profiler in the same process. Drop --profile --use-pytorch-profiler "
            "(torchprof's --torch-profile-step-start/-end give the same window)."
        )
    logger.warning("Megatron's --profile (nsys range) and --torch-profile are both on: CUPTI is shared, "
                   "so kernel timings in either may be incomplete")


def profiler_from_args(args: argparse.Namespace, *, start_iteration: int | None = None) -> TorchProfiler:
    """``TorchProfiler.from_args`` after the checks against Megatron's own profiling flags.

    Args:
        args: Megatron's parsed namespace.
        start_iteration: optimizer steps already done (default ``args.iteration``).

    Returns:
        The profiler, not started.
    """
    from torchprof_args.capture.runtime.profiler import TorchProfiler

    check_megatron_args(args)
    return TorchProfiler.from_args(args, start_iteration=start_iteration)
