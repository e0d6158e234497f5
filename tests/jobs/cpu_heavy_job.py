"""A CPU-operator-heavy gloo job: many short operators and many collectives issued at the step's top level.

The shape that made the publisher's analysis quadratic (issue 34): a deep stack of small linear layers
(thousands of short ``cpu_op`` events a step, with shapes and stacks when recorded), data parallel by
hand, as some trainers do it: after the backward pass every gradient is all-reduced with
``async_op=True`` from the step's top level and each is waited for, then a loss metric is all-reduced
and read with ``.item()``.  So every step issues ``--layers`` x 2 + 1 collectives, each with its gloo
span on the worker thread and a wait on the step's thread.

    torchrun --nproc_per_node 2 tests/jobs/cpu_heavy_job.py --result-dir . --iters 6 --torch-profile \
      --torch-profile-dir prof --torch-profile-ranks 0 --torch-profile-step-start 4 --torch-profile-active 2 \
      --torch-profile-record-shapes --torch-profile-with-stack --torch-profile-profile-memory

Writes ``--result-dir/rank<R>.json`` with how it ended.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--result-dir", required=True)
    add_torch_profile_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.GELU())])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    with TorchProfiler.from_args(args) as prof:
        for iteration in range(1, args.iters + 1):
            x = torch.randn(args.batch, args.width, generator=generator)
            loss = model(x).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
            for work, p in zip(works, model.parameters(), strict=True):
                work.wait()
                p.grad /= world
            optimizer.step()
            metric = loss.detach().clone()
            dist.all_reduce(metric)
            metric.item()
            prof.step(iteration)
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"), {"rank": rank, "ok": True})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
