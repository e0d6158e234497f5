"""A 2-rank gloo DDP MLP traced with shapes and logging the step timers' MFU (tests/test_mfu_disagreement.py).

    torchrun --nproc-per-node 2 tests/jobs/mfu_job.py --iters 8 \\
        --metrics-dir run --metrics-flops-per-iteration F --metrics-peak-tflops 1 \\
        --torch-profile --torch-profile-dir run/prof --torch-profile-ranks all \\
        --torch-profile-record-shapes --torch-profile-skip-first 3 --torch-profile-active 2

The model's FLOPs are known in closed form (tests/test_mfu_disagreement.py: 6 x batch x the weights'
multiply-adds, every rank's batch), so a test gives the step timers the right formula, or a wrong
one, and checks what ``torchprof diagnose`` says of the two MFUs.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from torchprof_args import MetricsWriter, TorchProfiler, add_torch_profile_args, validate_args

#: the layers' widths: 64 -> 1024 -> 1024 -> 64
WIDTHS = (64, 1024, 1024, 64)
BATCH = 32


def main() -> None:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    parser.add_argument("--iters", type=int, default=8)
    dist.init_process_group("gloo")
    args = validate_args(parser.parse_args())
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in zip(WIDTHS, WIDTHS[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers[:-1]))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(BATCH, WIDTHS[0])
    writer = MetricsWriter.from_args(args)
    with TorchProfiler.from_args(args) as prof:
        for iteration in range(1, args.iters + 1):
            started = time.perf_counter()
            model(inputs).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            writer.log_step(iteration, iteration_time=time.perf_counter() - started)
            prof.step(iteration)
    writer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
