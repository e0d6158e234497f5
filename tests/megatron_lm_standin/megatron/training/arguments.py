"""Stand-in for Megatron-LM's arguments.py: Megatron's own flags, then ``extra_args_provider``."""

import argparse
import os


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments (stand-in)", allow_abbrev=False)
    group = parser.add_argument_group(title="megatron")
    for name, kind, default in [
        ("--num-layers", int, 2), ("--hidden-size", int, 64), ("--num-attention-heads", int, 4),
        ("--seq-length", int, 32), ("--max-position-embeddings", int, 32), ("--vocab-size", int, 128),
        ("--micro-batch-size", int, 2), ("--global-batch-size", int, 4), ("--train-iters", int, 4),
        ("--lr", float, 1e-3), ("--seed", int, 1234), ("--tensor-model-parallel-size", int, 1),
        ("--pipeline-model-parallel-size", int, 1), ("--log-interval", int, 100),
        ("--tensorboard-dir", str, None), ("--timing-log-level", int, 0), ("--timing-log-option", str, "minmax"),
        ("--wandb-project", str, ""), ("--wandb-exp-name", str, ""), ("--wandb-save-dir", str, ""),
        ("--save", str, None), ("--load", str, None), ("--save-interval", int, None),
        ("--profile-step-start", int, 10), ("--profile-step-end", int, 12),
    ]:
        group.add_argument(name, type=kind, default=default)
    group.add_argument("--profile", action="store_true")
    group.add_argument("--use-pytorch-profiler", action="store_true")
    group.add_argument("--log-timers-to-tensorboard", action="store_true")
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    args = parser.parse_known_args()[0] if ignore_unknown_args else parser.parse_args()
    args.rank = int(os.getenv("RANK", "0"))
    args.world_size = int(os.getenv("WORLD_SIZE", "1"))
    args.iteration = 0
    args.consumed_train_samples = 0
    return args


def validate_args(args, defaults=None):
    args.data_parallel_size = args.world_size // (
        args.tensor_model_parallel_size * args.pipeline_model_parallel_size)
    return args


def parse_and_validate_args(extra_args_provider=None, args_defaults=None, ignore_unknown_args=False):
    return validate_args(parse_args(extra_args_provider, ignore_unknown_args), args_defaults)
