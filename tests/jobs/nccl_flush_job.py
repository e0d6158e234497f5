"""A 2-GPU NCCL job whose trace flush on rank 0 outlasts the NCCL collective timeout.

Every iteration ends with an NCCL all-reduce (like gradient sync).  Rank 0's trace export sleeps
``--export-delay`` seconds (longer than ``--pg-timeout``, the NCCL timeout) before exporting, so:

* ``--mode stock`` (torch.profiler + ``tensorboard_trace_handler(use_gzip=True)`` on rank 0): rank
  1 waits in its next all-reduce and the NCCL watchdog ends the job;
* ``--mode torchprof`` (TorchProfiler, give ``--torch-profile-export inline`` so that the delay
  lands on the training thread): every rank waits at the gloo fence instead, and both finish.

Each rank writes ``--result-dir/rank<R>.json`` with its per-iteration wall times.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from helpers import faults
from helpers.flush_loop import timed_steps
from helpers.gpu_train import Trainer

from torchprof_args import add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("stock", "torchprof"), required=True)
    parser.add_argument("--pg-timeout", type=float, default=5.0, help="NCCL collective timeout, seconds")
    parser.add_argument("--export-delay", type=float, default=12.0, help="added to rank 0's export, seconds")
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--result-dir", required=True)
    add_torch_profile_args(parser)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        "nccl",
        timeout=datetime.timedelta(seconds=args.pg_timeout),
        device_id=torch.device("cuda", local_rank),
    )
    rank = dist.get_rank()
    if rank == 0:
        faults.delay_exports(args.export_delay)
    trainer = Trainer(seed=rank)
    grad_sync = torch.ones(1 << 20, device="cuda")

    def train_step() -> None:
        trainer.step()
        dist.all_reduce(grad_sync)

    train_step()  # NCCL's communicator is set up before any timing
    torch.cuda.synchronize()
    profiler = None
    if args.mode == "stock" and rank == 0:
        profiler = torch.profiler.profile(
            schedule=torch.profiler.schedule(
                skip_first=args.torch_profile_skip_first,
                wait=args.torch_profile_wait,
                warmup=args.torch_profile_warmup,
                active=args.torch_profile_active,
                repeat=1,
            ),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(args.torch_profile_dir, use_gzip=True),
        )
    times = timed_steps(args, train_step, stock=args.mode == "stock", stock_profiler=profiler)
    torch.cuda.synchronize()
    dist.barrier()
    write_json_atomically(
        os.path.join(args.result_dir, f"rank{rank}.json"),
        {"rank": rank, "mode": args.mode, "times": times, "sum": float(grad_sync[0].item())},
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
