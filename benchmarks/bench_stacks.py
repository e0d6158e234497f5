"""What ``torchprof trigger --stacks`` costs a healthy job, and how fast every rank answers.

Four gloo ranks (torchrun) run ``tests/jobs/stacks_job.py`` (a small matrix product, an all-reduce
and a short sleep per step), the profiler on for on-demand traces (no request), three times: with
``--no-torch-profile-stacks-server`` (no server thread), with the server on as by default but no
request (its one stat a second), and with a stacks request every second (every rank answers from
its server thread; Python frames, as ``trigger --stacks`` asks by default; ``--native`` adds
py-spy's, which stops each rank while it unwinds).  Prints each run's step times (median, p90,
mean, from every rank's steps after the first 10) with the ratio to the run without the server,
and the requests' latency (request written -> every rank's answer published).

    .venv/bin/python benchmarks/bench_stacks.py [--iters 600] [--step-sleep 0.02] [--native]
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchprof_args.commands.trigger_stacks import request_stacks  # noqa: E402

JOB = REPO / "tests" / "jobs" / "stacks_job.py"
NPROC = 4
WARMUP_STEPS = 10


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_job(folder: Path, args: argparse.Namespace, flags: list[str], requests: bool) -> tuple[list, list]:
    """One job; returns (every rank's step seconds after the warm-up, request latencies)."""
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
           "OMP_NUM_THREADS": "1", "TORCHPROF_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={NPROC}",
               "--master_addr=127.0.0.1", f"--master_port={_port()}", str(JOB), "--result-dir", str(folder),
               "--iters", str(args.iters), "--step-sleep", str(args.step_sleep),
               "--torch-profile-dir", str(folder / "prof"), *flags]
    latencies = []
    with open(folder / "torchrun.log", "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        control = folder / "prof" / "stacks"
        while requests and proc.poll() is None:
            if (control / "job.json").exists() and len(list(folder.glob("rank*.pid"))) == NPROC:
                try:
                    outcome = request_stacks(control, native=args.native, timeout=10)
                except Exception:  # noqa: BLE001 - the job stopped between two requests
                    break
                if len(outcome["answered"]) == NPROC:
                    latencies.append(outcome["seconds"])
            time.sleep(1.0)
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"the job failed; see {folder / 'torchrun.log'}")
    steps = []
    for result in folder.glob("rank*.json"):
        steps += json.loads(result.read_text())["step_seconds"][WARMUP_STEPS:]
    return steps, latencies


def _figures(steps: list[float]) -> tuple[float, float, float]:
    ordered = sorted(steps)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))], statistics.fmean(ordered)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--native", action="store_true", help="requests ask for py-spy's native frames")
    args = parser.parse_args()
    profiling = ["--torch-profile-on-demand"]
    runs = [("--no-torch-profile-stacks-server", [*profiling, "--no-torch-profile-stacks-server"], False),
            ("stacks server on (the default), no request", profiling, False),
            (f"a request every second{' (--native)' if args.native else ''}", profiling, True)]
    print(f"CPU, {os.cpu_count()} cores; {NPROC} gloo ranks, {args.iters} steps "
          f"(step: 128x128 matmul + all-reduce of 4096 floats + {args.step_sleep * 1000:.0f} ms sleep), "
          f"each run with {' '.join(profiling)}")
    print(f"{'run':<42} {'median ms':>9} {'p90 ms':>7} {'mean ms':>8} {'ratio':>6}")
    base = None
    latencies: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as tmp:
        for index, (name, flags, requests) in enumerate(runs):
            steps, found = run_job(Path(tmp) / f"run{index}", args, flags, requests)
            median, p90, mean = _figures(steps)
            base = base or median
            latencies += found
            print(f"{name:<42} {median * 1e3:>9.2f} {p90 * 1e3:>7.2f} {mean * 1e3:>8.2f} "
                  f"{median / base:>6.3f}")
    if latencies:
        print(f"requests answered by all {NPROC} ranks: {len(latencies)}; latency median "
              f"{statistics.median(latencies):.2f} s, max {max(latencies):.2f} s (the ranks look once a "
              "second)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
