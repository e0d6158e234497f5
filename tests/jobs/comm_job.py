"""A gloo job of plain collectives under ``TorchProfiler``, for the collectives and hang tests (2 ranks;
32 in ``benchmarks/bench_world.py``).

Every iteration runs, in this order: an all-reduce of 256 floats, **the chosen all-reduce** of
4096 floats, a broadcast of 256 floats and an all-gather of 64 floats per rank, then
``prof.step(iteration)``.

* ``--slow-rank R --slow-iteration I --slow-seconds S``: rank R sleeps S seconds right before the
  chosen all-reduce of iteration I (the others wait for it inside that collective).
* ``--skip-rank R --skip-iteration I``: rank R leaves iteration I before the chosen all-reduce
  (a ``continue`` in the wrong place) and goes on to the profiler's step, while the others wait in
  that all-reduce until ``--pg-timeout``: a hang.
* ``--slow-dump-rank R --slow-dump-seconds S``: rank R's flight-recorder dump call takes S seconds
  longer (a dump slowed by an oversubscribed host), so that the launcher's SIGTERM arrives in it.

Each rank writes ``--result-dir/rank<R>.pid`` when it starts and ``rank<R>.json`` with how it ended.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


def slow_dump_calls(seconds: float) -> None:
    """Every flight-recorder dump call of this process sleeps ``seconds`` first."""
    from torchprof_args.capture.runtime import flight_recorder

    calls = flight_recorder._dump_calls

    def slowed(call):
        def dump():
            time.sleep(seconds)
            return call()
        return dump

    flight_recorder._dump_calls = lambda: {name: slowed(call) for name, call in calls().items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--pg-timeout", type=float, default=120.0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-iteration", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--skip-rank", type=int, default=-1)
    parser.add_argument("--skip-iteration", type=int, default=-1)
    parser.add_argument("--slow-dump-rank", type=int, default=-1)
    parser.add_argument("--slow-dump-seconds", type=float, default=0.0)
    parser.add_argument("--result-dir", required=True)
    add_torch_profile_args(parser)
    args = parser.parse_args()  # before the process group: --torch-profile-flight-recorder acts here
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    with open(os.path.join(args.result_dir, f"rank{rank}.pid"), "w") as handle:
        handle.write(str(os.getpid()))
    if rank == args.slow_dump_rank:
        slow_dump_calls(args.slow_dump_seconds)
    small, chosen = torch.ones(256), torch.ones(4096)
    gathered = [torch.zeros(64) for _ in range(dist.get_world_size())]
    outcome: dict = {"rank": rank, "pid": os.getpid()}
    try:
        with TorchProfiler.from_args(args) as prof:
            for iteration in range(1, args.iters + 1):
                dist.all_reduce(small)
                if rank == args.slow_rank and iteration == args.slow_iteration:
                    time.sleep(args.slow_seconds)
                if not (rank == args.skip_rank and iteration == args.skip_iteration):
                    dist.all_reduce(chosen)
                    dist.broadcast(small, 0)
                    dist.all_gather(gathered, torch.full((64,), float(rank)))
                prof.step(iteration)
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
