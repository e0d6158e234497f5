"""A plain argparse training script profiled with the ``torchprof_args.cli`` decorator.

    python integrations/cli/train.py --steps 6 --profiling --ptensorboard --prof_dir ./prof
    torchrun --nproc_per_node 2 integrations/cli/train.py --profiling --torch-profile-ranks all

Writes the trace(s) and ``profiler_list.dat`` to ``--prof_dir`` (default ``./prof``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

from torchprof_args import cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="toy regression trainer")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--start-step", type=int, default=0, help="steps already done (resume)")
    parser.add_argument("--batch-size", type=int, default=32)
    return parser


@cli(build_parser)
def main(args: argparse.Namespace, profiling) -> int:  # noqa: ANN001  (torchprof_args.cli.Profiling)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    profiling.start(start_iteration=args.start_step)
    for step in range(args.start_step + 1, args.steps + 1):
        with profiling.train_step():
            inputs = torch.randn(args.batch_size, 64)
            loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        profiling.step(step)
    if dist.is_initialized():
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
