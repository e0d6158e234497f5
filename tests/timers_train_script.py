"""A tiny 2-rank training job with Timers and MetricsWriter (run by tests/test_metrics.py via torchrun).

    torchrun --standalone --nproc_per_node 2 tests/timers_train_script.py --metrics-dir DIR [--mismatch]
    torchrun --standalone --nproc_per_node 2 tests/timers_train_script.py --gather-check RESULT_DIR

Trains a small MLP with gloo DDP on CPU for --train-iters iterations, timing the steps with
``torchprof_args.Timers`` and writing every --log-interval iterations with ``MetricsWriter``
(one ``log_step`` call) plus a Megatron-style ``timers.write(names, writer, iteration)``.
Rank 1 sleeps 10 ms longer in "batch-generator" so min and max across ranks differ.
With --mismatch the ranks log different timer names and must both get a clear error.
With --gather-check each rank records, interval by interval, how many collectives the gather
issued, what it returned and the straggler warnings (rank 1 is slow in "forward-backward"),
into RESULT_DIR/rank<R>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from torchprof_args import MetricsWriter, Timers, add_torch_profile_args, validate_args
from torchprof_args.errors import TimerNamesMismatchError


def main() -> int:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    parser.add_argument("--train-iters", type=int, default=8)
    parser.add_argument("--mismatch", action="store_true")
    parser.add_argument("--gather-check", metavar="RESULT_DIR")
    dist.init_process_group("gloo")
    args = validate_args(parser.parse_args())
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    timers = Timers.from_args(args)
    batch = 16

    if args.gather_check:
        return gather_check(args, timers, rank)

    if args.mismatch:
        timers("forward-backward", log_level=0).start()
        timers("forward-backward").stop()
        names = ["forward-backward"] + (["optimizer"] if rank == 1 else [])
        try:
            timers.log(names)
        except TimerNamesMismatchError as err:
            print(f"MISMATCH rank {rank}: {err}", flush=True)
            dist.destroy_process_group()
            return 0
        print(f"rank {rank}: no error for mismatched names", flush=True)
        return 1

    writer = MetricsWriter.from_args(
        args, timers=timers, samples_per_iteration=batch * 2, tokens_per_iteration=batch * 2 * 32,
        flops_per_iteration=6.0 * batch * 2 * (32 * 64 + 64),
    )
    names = ["batch-generator", "forward-backward", "optimizer"]
    flush_seconds = 0.0
    for iteration in range(1, args.train_iters + 1):
        timers("batch-generator", log_level=0).start()
        inputs, targets = torch.randn(batch, 32), torch.randn(batch, 1)
        time.sleep(0.002 + 0.010 * rank)
        timers("batch-generator").stop()
        timers("forward-backward", log_level=0).start()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        timers("forward-backward").stop()
        timers("optimizer", log_level=0).start()
        optimizer.step()
        optimizer.zero_grad()
        timers("optimizer").stop()
        timers("not-logged", log_level=2).start()  # above --timing-log-level 0: a no-op
        timers("not-logged").stop()
        flush_seconds += 0.01 * (rank + 1)
        if iteration % args.log_interval == 0:
            timers("optimizer").start()
            timers("optimizer").stop()
            # Megatron style: one timer through Timers.write into the writer (buffered and
            # written together with log_step's record for the same iteration).
            timers.write(["optimizer"], writer, iteration, normalizer=args.log_interval)
            writer.log_step(
                iteration,
                names=names[:2],
                extra={"flush_seconds": flush_seconds, "trace_mb": 1.5 + rank, "traces_written": 1},
            )
    writer.close()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    return 0


def gather_check(args: argparse.Namespace, timers: Timers, rank: int) -> int:
    """Intervals of the fixed-size gather: what each cost in collectives and what came back."""
    gather = timers._rank_gather
    intervals = []

    def interval(iteration: int, names, figures=None, new_timer: str | None = None) -> None:
        # readings injected (Timer.set_elapsed), not measured: the test checks arithmetic, not timing
        for name in ("forward-backward", "optimizer") + ((new_timer,) if new_timer else ()):
            timers(name, log_level=0).set_elapsed(
                0.004 if (name == "forward-backward" and rank == 1) else 0.001)
        before = gather.collectives
        snapshot = timers.gather(names, per_rank=figures)
        scalars, per_rank = timers.interval_figures(snapshot, 1.0, iteration)
        intervals.append({"iteration": iteration, "collectives": gather.collectives - before,
                          "names": snapshot.names, "times": snapshot.times, "per_rank": snapshot.per_rank,
                          "global_ranks": snapshot.global_ranks, "scalars": scalars, "scores": per_rank})

    for iteration in range(1, 5):  # the same names: agree once, then one collective an interval
        interval(iteration, ["forward-backward", "optimizer"], {"memory/x": float(rank)})
    interval(5, None, {"memory/x": float(rank), "profiler/y": 1.0} if rank == 0 else {"memory/x": 1.0})
    interval(6, None, {"memory/x": 2.0}, new_timer="eval" if rank == 1 else None)  # a new timer on rank 1
    interval(7, ["forward-backward", "optimizer"], {"memory/x": float(rank)})  # back to a known layout
    error = None
    try:  # rank 1 asks for other names after the layout was agreed: an error on both ranks, no hang
        timers.gather(["forward-backward"] + (["optimizer"] if rank == 1 else []))
    except TimerNamesMismatchError as err:
        error = str(err)
    result = {"rank": rank, "intervals": intervals, "warnings": timers.stragglers.warnings, "mismatch": error}
    with open(os.path.join(args.gather_check, f"rank{rank}.json"), "w") as handle:
        json.dump(result, handle, allow_nan=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_code = main()
    # Everything is written and closed; skip interpreter teardown, where torch's C++ threads
    # occasionally abort ("terminate called without an active exception") on this CPU build.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
