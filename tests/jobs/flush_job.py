"""A 2-rank job whose trace flush on rank 0 is slow, with a short collective timeout.

``--mode stock`` profiles rank 0 with ``torch.profiler`` and the stock
``tensorboard_trace_handler(use_gzip=True)``; ``--mode torchprof`` uses ``TorchProfiler`` with the
same schedule and options.  Every iteration ends with an all-reduce (like gradient sync), so a
rank that spends longer than ``--pg-timeout`` flushing makes the other rank's collective time out.

Each rank writes ``--result-dir/rank<R>.json`` with its per-iteration wall times (files, not
stdout: torchrun interleaves the ranks' output lines).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from helpers.demo_model import TinyGPT, synthetic_batches  # tests/ is on PYTHONPATH (subprocess_env)
from helpers.flush_loop import timed_steps

from torchprof_args import add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("stock", "floor", "torchprof", "none"), required=True,
                        help="floor: torch.profiler whose trace handler does nothing (stop() alone)")
    parser.add_argument("--pg-timeout", type=float, default=3.0)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--result-dir", required=True, help="where each rank writes rank<R>.json")
    add_torch_profile_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = TinyGPT(vocab=256, hidden=args.hidden, layers=args.layers, heads=4, seq_len=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = synthetic_batches(256, 32, 4, seed=rank)
    grad_sync = torch.zeros(1024)

    def train_step() -> None:
        tokens, targets = next(batches)
        loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, 256), targets.reshape(-1))
        loss.backward()
        dist.all_reduce(grad_sync)  # the collective a slow flush makes the other rank wait in
        optimizer.step()
        optimizer.zero_grad()

    stock = args.mode in ("stock", "floor")
    profiler = None
    if stock and rank == 0:
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(
                wait=args.torch_profile_wait or 0, warmup=args.torch_profile_warmup or 1,
                active=args.torch_profile_active or 1, repeat=args.torch_profile_repeat or 1,
                skip_first=args.torch_profile_skip_first or 1,
            ),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(args.torch_profile_dir, use_gzip=True)
            if args.mode == "stock" else (lambda _prof: None),
            record_shapes=args.torch_profile_record_shapes,
            profile_memory=args.torch_profile_profile_memory,
            with_stack=args.torch_profile_with_stack,
        )
    if args.mode == "none":
        args.torch_profile = False
    times = timed_steps(args, train_step, stock=stock, stock_profiler=profiler)
    dist.barrier()
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"), {
        "rank": rank, "mode": args.mode, "times": times,
        "traces": sorted(os.listdir(args.torch_profile_dir))
        if args.torch_profile_dir and os.path.isdir(args.torch_profile_dir) else []})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
