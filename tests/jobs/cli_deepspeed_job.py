"""A ``@torchprof_args.cli`` program with a ``--strategy`` switch, seed style: ``--strategy zero``
trains through a DeepSpeed engine (CPU, gloo) and the decorator attaches the profiler to it."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402

from torchprof_args import cli  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cli_deepspeed_job")
    parser.add_argument("--strategy", choices=("zero",), default="zero")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=4)
    return parser


@cli(build_parser)
def main(args: argparse.Namespace, profiling) -> int:  # noqa: ANN001
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # build no ops on CPU
    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "zero_optimization": {"stage": 2}, "steps_per_print": 10**6,
              "flops_profiler": {"enabled": True, "profile_step": 1}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
                                      config=config)
    profiling.attach_deepspeed(engine)
    while engine.global_steps < args.steps:
        with profiling.train_step():
            loss = engine(torch.randn(4, 32)).pow(2).mean()
            engine.backward(loss)
            engine.step()
        profiling.step()  # a no-op: the engine's optimizer steps drive the profiler
    print(json.dumps({"steps": engine.global_steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
