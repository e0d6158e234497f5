"""A 2-rank gloo training job with ``--torch-profile-on-demand`` that runs until told to stop.

Every iteration ends with an all-reduce (like gradient sync) that also carries rank 0's "stop"
flag, so all ranks leave the loop at the same iteration once ``--stop-file`` exists (or after
``--max-iters``).  Each rank writes ``--result-dir/rank<R>.json`` at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from torchprof_args import TorchProfileArgsError, TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--result-dir", required=True, help="where each rank writes rank<R>.json")
    parser.add_argument("--max-iters", type=int, default=5000)
    parser.add_argument("--sleep", type=float, default=0.01)
    add_torch_profile_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    try:
        prof = TorchProfiler.from_args(args)
    except TorchProfileArgsError as err:
        print(f"ondemand_job.py: error: {err}", file=sys.stderr)
        return 2
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    sync = torch.zeros(2)
    iteration = 0
    with prof:
        while iteration < args.max_iters:
            iteration += 1
            model(torch.randn(16, 64)).pow(2).mean().backward()
            sync.zero_()
            if rank == 0 and os.path.exists(args.stop_file):
                sync[0] = 1.0
            dist.all_reduce(sync)
            optimizer.step()
            optimizer.zero_grad()
            prof.step(iteration)
            if sync[0] > 0:
                break
            time.sleep(args.sleep)
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"), {
        "rank": rank, "iterations": iteration, "pid": os.getpid(), "traces": prof.published_traces})
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
