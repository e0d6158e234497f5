"""A minimal stand-in for Megatron-LM's ``megatron.training`` package (not installable here).

Only what torchprof_args.megatron.install() touches is reproduced, with Megatron-LM's module
layout and call structure: ``pretrain`` -> ``train`` -> per iteration ``train_step`` then
``training_log(..., iteration, ...)`` looked up as module globals; global args, timers and the
TensorBoard/wandb writers in ``global_vars``.  Models and parallel state are megatron-core's own.
"""

from .arguments import parse_and_validate_args, parse_args
from .global_vars import get_args, get_tensorboard_writer, get_timers, get_wandb_writer
from .training import pretrain

__all__ = ["get_args", "get_tensorboard_writer", "get_timers", "get_wandb_writer", "parse_and_validate_args",
           "parse_args", "pretrain"]
