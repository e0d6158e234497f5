"""Cost of ``prof.step()`` on the training thread when nothing happens, per call, vs an empty loop.

Cases: profiling off; a traced rank in the wait phase (first cycle far away); a rank that is not
traced while others are.  Target (core issue): under 1 microsecond per call when off.

    .venv/bin/python benchmarks/bench_step_overhead.py [--calls 2000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchprof_args import TorchProfiler, add_torch_profile_args  # noqa: E402


def per_call(loop, calls: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        loop(calls)
        best = min(best, time.perf_counter() - started)
    return best / calls


def empty_loop(calls: int) -> None:
    for _iteration in range(1, calls + 1):
        pass


def profiler_loop(prof: TorchProfiler):
    step = prof.step

    def loop(calls: int) -> None:
        for iteration in range(1, calls + 1):
            step(iteration)

    return loop


def make(argv: list[str], rank: int = 0, world: int = 1) -> TorchProfiler:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(argv)
    prof = TorchProfiler.from_args(args)
    prof.start()
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-step-overhead-") as out:  # removed at the end
        far = str(10 * args.calls)
        cases = {
            "empty loop": empty_loop,
            "off": profiler_loop(make([])),
            "traced rank, wait phase": profiler_loop(make(["--torch-profile", "--torch-profile-dir", out,
                                                           "--torch-profile-skip-first", far])),
            "untraced rank": profiler_loop(make(["--torch-profile", "--torch-profile-dir", out,
                                                 "--torch-profile-ranks", "0"], rank=1, world=2)),
        }
        baseline = per_call(empty_loop, args.calls)
        print(f"{'case':28s}{'ns/call':>10s}{'over empty ns':>15s}")
        results = {}
        for name, loop in cases.items():
            cost = per_call(loop, args.calls)
            results[name] = cost - baseline
            print(f"{name:28s}{cost * 1e9:10.1f}{(cost - baseline) * 1e9:15.1f}")
    print(f"\ntarget < 1000 ns over empty when off: {'met' if results['off'] < 1e-6 else 'NOT met'}")


if __name__ == "__main__":
    main()
