"""Flush stall: extra wall time of the step at which a trace is written, on 2 real gloo ranks.

Compares, on the same model and flags (record-shapes, profile-memory, with-stack):
  stock      torch.profiler + tensorboard_trace_handler(use_gzip=True) on rank 0
  floor      torch.profiler whose trace handler does nothing: stop() alone, the floor
  torchprof  TorchProfiler (fork export, gloo barrier, background publisher)
  inline     TorchProfiler --torch-profile-export inline

Stall = flush-step time minus the median of the other steps, on rank 0; median of --repeats runs.
Target (core issue): torchprof / stock <= 0.3.

    .venv/bin/python benchmarks/bench_flush_stall.py [--repeats 3] [--layers 24] [--active 10]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "jobs" / "flush_job.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_once(mode: str, layers: int, active: int, iters: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        extra = ["--torch-profile"] if mode in ("torchprof", "inline") else []
        if mode == "inline":
            extra += ["--torch-profile-export", "inline"]
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", str(JOB), "--mode", "torchprof" if mode == "inline" else mode,
            "--pg-timeout", "600", "--iters", str(iters), "--layers", str(layers), "--torch-profile-dir", out,
            "--torch-profile-active", str(active), "--torch-profile-record-shapes",
            "--torch-profile-profile-memory", "--torch-profile-with-stack",
            "--no-torch-profile-operator-table", "--result-dir", os.path.join(out, "results"), *extra,
        ]
        # tests/ for the job's helpers (the demo model, the timed loop)
        pythonpath = os.pathsep.join((str(REPO), str(REPO / "tests")))
        env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1",
               "TORCHPROF_LOG_LEVEL": "WARNING"}
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if run.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{run.stderr[-2000:]}")
        with open(os.path.join(out, "results", "rank0.json")) as handle:
            rank0 = json.load(handle)
    times = rank0["times"]
    flush_index = 1 + 1 + active - 1  # skip-first 1, warmup 1, then `active` recorded steps
    others = [t for i, t in enumerate(times) if i != flush_index]
    return times[flush_index] - statistics.median(others)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--active", type=int, default=10)
    args = parser.parse_args()
    iters = args.active + 4
    stalls = {}
    for mode in ("stock", "floor", "torchprof", "inline"):
        runs = [run_once(mode, args.layers, args.active, iters) for _ in range(args.repeats)]
        stalls[mode] = statistics.median(runs)
        print(f"  {mode:10s} runs: {', '.join(f'{r:.2f}s' for r in runs)}", flush=True)
    stock = stalls["stock"]
    print(f"\nflush stall on rank 0 (median of {args.repeats}; {args.layers} layers, "
          f"{args.active} active steps)")
    print(f"{'mode':12s}{'stall s':>10s}{'vs stock':>10s}{'vs floor':>10s}")
    for mode, stall in stalls.items():
        print(f"{mode:12s}{stall:10.2f}{stall / stock:10.2f}{stall / stalls['floor']:10.2f}")
    print(f"\ntarget torchprof/stock <= 0.30: {'met' if stalls['torchprof'] / stock <= 0.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
