"""What ``--torch-profile-on-demand`` costs the training thread per step, averaged over a long run
including the periodic request checks, side by side with an empty loop and with profiling off.

Part 1, one process (rank 0's own work: a ``stat`` of ``requests/`` per check, a ``scandir`` when
it changed).  Target (on-demand issue): under 1 microsecond per step on average with the default
settings.  The "check every step" row shows the cost of one check.

Part 2, two gloo ranks launched with torchrun (skip with ``--no-ranks``): each step does a tiny
all-reduce so the ranks run in lock step like training; only the time inside ``prof.step()`` is
summed.  A check there also posts one asynchronous broadcast on the gloo group and collects the
previous one.  Checks are paced by time (``--torch-profile-on-demand-check-seconds``, default
10 s), so the per-step average shrinks as steps get shorter; the "stress" row checks every 10 ms.

    .venv/bin/python benchmarks/bench_ondemand.py [--calls 2000000] [--rank-steps 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TORCHPROF_LOG_LEVEL", "WARNING")  # no "ready" line per run

from torchprof_args import TorchProfiler, add_torch_profile_args  # noqa: E402
from torchprof_args.atomic import write_json_atomically  # noqa: E402
from torchprof_args.capture.ondemand.inbox import MTIME_SETTLE_SECONDS  # noqa: E402


def per_call(loop, calls: int, rounds: int = 3) -> float:
    """Best of ``rounds`` of the time per call; ``loop(calls)`` returns the seconds it measured."""
    return min(loop(calls) for _ in range(rounds)) / calls


def empty_loop(calls: int) -> float:
    started = time.perf_counter()
    for _iteration in range(1, calls + 1):
        pass
    return time.perf_counter() - started


def make(argv: list[str]) -> TorchProfiler:
    args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(argv)
    return TorchProfiler.from_args(args)


def profiler_loop(argv: list[str]):
    def loop(calls: int) -> float:
        with make(argv) as prof:  # a fresh run each round (iterations start at 1); set-up not timed
            step = prof.step
            started = time.perf_counter()
            for iteration in range(1, calls + 1):
                step(iteration)
            return time.perf_counter() - started

    return loop


def single_process(calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ondemand-") as out:  # removed at the end
        _single_process(calls, out)


def _single_process(calls: int, out: str) -> None:
    os.environ["TORCHPROF_RUNTIME_DIR"] = os.path.join(out, "runtime")
    on = ["--torch-profile-on-demand", "--torch-profile-dir", out]
    # Steady state of a long job: requests/ untouched for a while, so a check is one stat().
    # (Right after creating it, rank 0 also lists it: the mtime may be too coarse to trust yet.)
    make(on)
    time.sleep(MTIME_SETTLE_SECONDS + 0.5)
    every_step = [*on, "--torch-profile-on-demand-interval", "1",
                  "--torch-profile-on-demand-check-seconds", "1e-9"]
    cases = [
        ("profiling off", profiler_loop([]), calls),
        ("on-demand (default settings)", profiler_loop(on), calls),
        ("on-demand, check every step", profiler_loop(every_step), max(calls // 20, 1000)),
    ]
    baseline = per_call(empty_loop, calls)
    print(f"part 1: one process, {calls} steps per run (best of 3)")
    print(f"{'case':44s}{'ns/step':>10s}{'over empty ns':>15s}")
    print(f"{'empty loop':44s}{baseline * 1e9:10.1f}{0.0:15.1f}")
    results = {}
    for name, loop, n in cases:
        cost = per_call(loop, n)
        results[name] = cost - baseline
        print(f"{name:44s}{cost * 1e9:10.1f}{(cost - baseline) * 1e9:15.1f}")
    default = results["on-demand (default settings)"]
    print("\ntarget < 1000 ns/step over empty with default settings: "
          f"{'met' if default < 1e-6 else 'NOT met'} ({default * 1e9:.0f} ns); one check costs about "
          f"{(results['on-demand, check every step'] - results['profiling off']) * 1e6:.1f} us")


# ---------------------------------------------------------------------------------------------
# Part 2: real ranks.


def rank_worker(steps: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    tensor = torch.zeros(8)
    figures = {}
    for name, argv in [("off", []), ("default", ["--torch-profile-on-demand"]),
                       ("stress", ["--torch-profile-on-demand", "--torch-profile-on-demand-interval", "1",
                                   "--torch-profile-on-demand-check-seconds", "0.01"])]:
        prof = make([*argv, "--torch-profile-dir", out])
        if argv and name == "default":
            time.sleep(MTIME_SETTLE_SECONDS + 0.5)  # steady state: see single_process()
        inside = 0.0
        with prof:
            for iteration in range(1, steps + 1):
                dist.all_reduce(tensor)  # keeps the ranks in lock step, like gradient sync
                started = time.perf_counter()
                prof.step(iteration)
                inside += time.perf_counter() - started
        figures[name] = inside / steps
        figures[f"{name} checks"] = prof._on_demand.checks if prof._on_demand is not None else 0
    # A file per rank: torchrun interleaves the ranks' stdout lines.
    write_json_atomically(os.path.join(out, "results", f"rank{rank}.json"), {"rank": rank, **figures})
    dist.barrier()
    dist.destroy_process_group()


def two_ranks(steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ondemand-ranks-") as out:  # removed at the end
        _two_ranks(steps, out)


def _two_ranks(steps: int, out: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHPROF_RUNTIME_DIR": os.path.join(out, "runtime"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "--master_addr=127.0.0.1", f"--master_port={port}", __file__, "--worker",
                          "--rank-steps", str(steps), "--out", out],
                         capture_output=True, text=True, env=env, timeout=1200)
    result_files = sorted(Path(out, "results").glob("rank*.json"))
    results = [json.loads(path.read_text()) for path in result_files]
    if run.returncode != 0 or len(results) != 2:
        print(f"part 2 failed:\n{(run.stdout + run.stderr)[-3000:]}")
        return
    print(f"\npart 2: two gloo ranks, {steps} lock-step iterations, time inside prof.step() only")
    ordered = sorted(results, key=lambda r: r["rank"])
    header = [f"rank {r['rank']} ns/step" for r in ordered]
    print(f"{'case':20s}" + "".join(f"{h:>18s}" for h in header))
    for name in ("off", "default", "stress"):
        row = "".join(f"{r[name] * 1e9:18.0f}" for r in ordered)
        print(f"{name:20s}{row}   ({ordered[0][f'{name} checks']} checks)")
    rank0 = ordered[0]
    extra = rank0["default"] - rank0["off"]
    per_check = (rank0["stress"] - rank0["off"]) * steps / max(rank0["stress checks"], 1)
    print(f"default settings: {extra * 1e9:.0f} ns/step over off on rank 0 "
          f"({'met' if extra < 1e-6 else 'NOT met'}: target < 1000 ns); "
          f"one check (post + collect the asynchronous broadcast) costs about {per_check * 1e6:.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2_000_000, help="steps per single-process run")
    parser.add_argument("--rank-steps", type=int, default=5000, help="steps per run on the two ranks")
    parser.add_argument("--no-ranks", action="store_true", help="skip part 2 (torchrun, two ranks)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        rank_worker(args.rank_steps, args.out)
        return
    single_process(args.calls)
    if not args.no_ranks:
        two_ranks(args.rank_steps)


if __name__ == "__main__":
    main()
