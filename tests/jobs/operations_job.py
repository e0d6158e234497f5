"""A 2-rank gloo job with known costs, for the operations tests (Prometheus, goodput, trend).

A small DDP MLP timed with ``torchprof_args.Timers`` and written by ``MetricsWriter`` every
``--log-interval`` iterations (``extra=prof.stats``), profiled by ``TorchProfiler`` with the
``--torch-profile-*`` flags given.  The costs it injects, each a sleep inside the timer named the way
the goodput ledger reads it:

* ``--startup-sleep S``: before the metrics writer starts (start-up);
* ``--checkpoint-every N --checkpoint-sleep S``: ``save-checkpoint`` at multiples of N; rank 0
  records ``{"iteration", "saved_at"}`` in ``--checkpoint FILE``;
* ``--resume``: start from the iteration in ``--checkpoint FILE``, timing ``load-checkpoint``
  (``--load-sleep S``) before the writer;
* ``--data-sleep S``: ``batch-generator`` every step (rank 1 sleeps ``--slow-rank-extra`` longer);
* ``--eval-every N --eval-sleep S``: ``evaluate``.

``--progress FILE``: rank 0 records the last finished iteration after every step (the test kills the
job from there).  ``--hold FILE``: after the last iteration every rank waits (at most 60 s) until
FILE exists before closing the writer (a scraper reads the final values meanwhile).  Each rank
writes ``--result-dir/startup_rank<R>.json`` before its writer starts (``process_start``, ``ready``:
after the imports, ``before_sleep``, ``after_sleep``) and ``rank<R>.json`` at the end (``prof.stats``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from torchprof_args import MetricsWriter, Timers, TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically
from torchprof_args.shared.metrics_log import process_start_time

READY = time.time()


def parse() -> argparse.Namespace:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--startup-sleep", type=float, default=0.0)
    parser.add_argument("--checkpoint", metavar="FILE")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--checkpoint-sleep", type=float, default=0.0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--load-sleep", type=float, default=0.0)
    parser.add_argument("--data-sleep", type=float, default=0.002)
    parser.add_argument("--slow-rank-extra", type=float, default=0.010)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--eval-sleep", type=float, default=0.0)
    parser.add_argument("--progress", metavar="FILE")
    parser.add_argument("--hold", metavar="FILE")
    parser.add_argument("--result-dir", required=True)
    return parser.parse_args()


def main() -> int:
    args = parse()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    timers = Timers.from_args(args)
    start = 0
    if args.resume and args.checkpoint and Path(args.checkpoint).exists():
        timers("load-checkpoint", log_level=0).start()
        start = json.loads(Path(args.checkpoint).read_text())["iteration"]
        time.sleep(args.load_sleep)
        timers("load-checkpoint").stop()
    before_sleep = time.time()
    time.sleep(args.startup_sleep)
    write_json_atomically(
        os.path.join(args.result_dir, f"startup_rank{rank}.json"),
        {
            "process_start": process_start_time(),
            "ready": READY,
            "before_sleep": before_sleep,
            "after_sleep": time.time(),
        },
    )
    prof = TorchProfiler.from_args(args, start_iteration=start)
    with prof:
        writer = MetricsWriter.from_args(args, timers=timers, start_iteration=start)
        for iteration in range(start + 1, args.iters + 1):
            train_step(args, model, optimizer, timers, rank, iteration)
            prof.step(iteration)
            if iteration % args.log_interval == 0:
                writer.log_step(iteration, extra=prof.stats)
            if rank == 0 and args.progress:
                write_json_atomically(args.progress, {"iteration": iteration, "time": time.time()})
        hold(args.hold)
        writer.close()
        stats = prof.stats
    write_json_atomically(
        os.path.join(args.result_dir, f"rank{rank}.json"),
        {"rank": rank, "ready": READY, "stats": stats, "start": start},
    )
    dist.barrier()
    dist.destroy_process_group()
    return 0


def train_step(
    args: argparse.Namespace,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    timers: Timers,
    rank: int,
    iteration: int,
) -> None:
    timers("batch-generator", log_level=0).start()
    inputs, targets = torch.randn(16, 32), torch.randn(16, 1)
    time.sleep(args.data_sleep + args.slow_rank_extra * rank)
    timers("batch-generator").stop()
    timers("forward-backward", log_level=0).start()
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    time.sleep(args.step_sleep)
    timers("forward-backward").stop()
    timers("optimizer", log_level=0).start()
    optimizer.step()
    optimizer.zero_grad()
    timers("optimizer").stop()
    if args.eval_every and iteration % args.eval_every == 0:
        timers("evaluate", log_level=0).start()
        time.sleep(args.eval_sleep)
        timers("evaluate").stop()
    if args.checkpoint_every and iteration % args.checkpoint_every == 0:
        timers("save-checkpoint", log_level=0).start()
        time.sleep(args.checkpoint_sleep)
        dist.barrier()
        if rank == 0 and args.checkpoint:
            write_json_atomically(args.checkpoint, {"iteration": iteration, "saved_at": time.time()})
        timers("save-checkpoint").stop()


def hold(path: str | None) -> None:
    if not path:
        return
    Path(f"{path}.waiting").touch()
    deadline = time.monotonic() + 60
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)  # torch's C++ threads sometimes abort at interpreter teardown on this CPU build
