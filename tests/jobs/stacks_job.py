"""A gloo job (4 ranks in the tests) for the stacks tests: one rank stuck where the flight recorder
cannot see it, or a healthy job whose step times are recorded.

Every iteration: a small matrix product, an all-reduce of 4096 floats, ``--step-sleep`` seconds,
then ``prof.step(iteration)``.

* ``--spin-rank R --at-iteration I``: rank R spins in a Python loop before iteration I's all-reduce;
* ``--pipe-rank R --at-iteration I``: rank R blocks in ``os.read`` on a pipe nobody writes (a C call),
  before iteration I's all-reduce.
The others wait in that all-reduce (until ``--pg-timeout``).
* ``--stop-file PATH``: every rank leaves the loop at the first iteration that finds PATH (at most
  ``--iters``): a job that trains until the test is done with it.

Each rank writes ``--result-dir/rank<R>.pid`` when it starts, ``stuck<R>`` when it gets stuck, and
``rank<R>.json`` with how it ended and its step times.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


def spin_before_all_reduce() -> None:
    """A Python loop that never ends (a livelock, a retry loop without a limit)."""
    counter = 0
    while True:
        counter += 1


def read_from_pipe_nobody_writes() -> bytes:
    """Blocked in C: a read that never returns (a socket, a FIFO, a lock file)."""
    read_end, _write_end = os.pipe()
    return os.read(read_end, 1)


def stop_agreed(path: str) -> bool:
    """Whether rank 0 sees ``path``, agreed by every rank (so that all leave at the same iteration)."""
    seen = torch.tensor([float(dist.get_rank() == 0 and os.path.exists(path))])
    dist.broadcast(seen, src=0)
    return bool(seen.item())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--pg-timeout", type=float, default=120.0)
    parser.add_argument("--spin-rank", type=int, default=-1)
    parser.add_argument("--pipe-rank", type=int, default=-1)
    parser.add_argument("--at-iteration", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--size", type=int, default=128, help="matrix size of each step's product")
    parser.add_argument("--result-dir", required=True)
    parser.add_argument("--stop-file", default=None)
    add_torch_profile_args(parser)
    args = parser.parse_args()  # before the process group: --torch-profile-flight-recorder acts here
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    with open(os.path.join(args.result_dir, f"rank{rank}.pid"), "w") as handle:
        handle.write(str(os.getpid()))
    weights, grads = torch.randn(args.size, args.size), torch.ones(4096)
    outcome: dict = {"rank": rank, "pid": os.getpid(), "step_seconds": []}
    try:
        with TorchProfiler.from_args(args) as prof:
            for iteration in range(1, args.iters + 1):
                if args.stop_file and stop_agreed(args.stop_file):
                    break
                started = time.perf_counter()
                weights = torch.tanh(weights @ weights)
                if iteration == args.at_iteration and rank in (args.spin_rank, args.pipe_rank):
                    Path(args.result_dir, f"stuck{rank}").touch()  # for the docs' example: it is stuck now
                    if rank == args.spin_rank:
                        spin_before_all_reduce()
                    read_from_pipe_nobody_writes()
                dist.all_reduce(grads)
                time.sleep(args.step_sleep)
                prof.step(iteration)
                outcome["step_seconds"].append(time.perf_counter() - started)
        outcome["ended"] = "done"
    except BaseException as err:  # noqa: BLE001 - the test reads how each rank ended
        outcome.update(ended=type(err).__name__, error=str(err)[:500],
                       traceback=traceback.format_exc()[-2000:])
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"), outcome)
    if outcome["ended"] == "done":
        dist.destroy_process_group()
    return 0 if outcome["ended"] == "done" else 1


if __name__ == "__main__":
    code = main()
    os._exit(code)  # skip interpreter teardown (torch's C++ threads may abort there on this CPU build)
