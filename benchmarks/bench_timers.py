"""Cost of torchprof_args.Timers on CPU against a bare ``time.perf_counter`` pair, side by side.

    python benchmarks/bench_timers.py [--pairs 200000] [--repeats 5]

Rows (best of --repeats, nanoseconds per start/stop pair):
  bare perf_counter pair      t0 = perf_counter(); t1 = perf_counter(); acc += t1 - t0
  Timer object start/stop     timer.start(); timer.stop()           (timer kept in a variable)
  timers(name) lookup + pair  timers("fwd").start(); timers("fwd").stop()  (Megatron's usage)
  dummy timer (level > log)   timers("off").start(); timers("off").stop()
and the cost of one log interval (Timers.gather of 8 timers + MetricsWriter.log_step to
metrics.jsonl) in microseconds.  Target: under 2 microseconds per pair above the bare pair.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchprof_args.metrics.config import MetricsConfig  # noqa: E402
from torchprof_args.metrics.timers import Timers  # noqa: E402
from torchprof_args.metrics.writer import MetricsWriter  # noqa: E402


def _best_ns_per_pair(run: Callable[[int], None], pairs: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run(pairs)
        best = min(best, (time.perf_counter() - start) / pairs * 1e9)
    return best


def bare_pair(pairs: int) -> None:
    perf_counter = time.perf_counter
    accumulated = 0.0
    for _ in range(pairs):
        t0 = perf_counter()
        t1 = perf_counter()
        accumulated += t1 - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--intervals", type=int, default=200)
    options = parser.parse_args()

    timers = Timers(1, "minmax", device="cpu")
    timer = timers("fwd", log_level=0)

    def object_pair(pairs: int) -> None:
        for _ in range(pairs):
            timer.start()
            timer.stop()

    def lookup_pair(pairs: int) -> None:
        for _ in range(pairs):
            timers("fwd").start()
            timers("fwd").stop()

    def dummy_pair(pairs: int) -> None:
        for _ in range(pairs):
            timers("off", log_level=2).start()
            timers("off", log_level=2).stop()

    bare = _best_ns_per_pair(bare_pair, options.pairs, options.repeats)
    rows = [
        ("bare perf_counter pair", bare),
        ("Timer object start/stop", _best_ns_per_pair(object_pair, options.pairs, options.repeats)),
        ("timers(name) lookup + pair", _best_ns_per_pair(lookup_pair, options.pairs, options.repeats)),
        ("dummy timer (level > log)", _best_ns_per_pair(dummy_pair, options.pairs, options.repeats)),
    ]
    print(f"start/stop pair, CPU, best of {options.repeats} x {options.pairs} pairs")
    print(f"{'':30s} {'ns/pair':>10s} {'above bare':>12s} {'ratio':>7s}")
    for label, ns in rows:
        print(f"{label:30s} {ns:10.0f} {ns - bare:+12.0f} {ns / bare:7.2f}x")
    worst_above = max(ns - bare for _, ns in rows[1:])
    print(f"target: < 2000 ns above bare per pair -> worst {worst_above:.0f} ns: "
          f"{'MET' if worst_above < 2000 else 'MISSED'}")

    names = [f"timer-{i}" for i in range(8)]
    with tempfile.TemporaryDirectory() as directory:
        log_timers = Timers(0, "minmax", device="cpu")
        writer = MetricsWriter(MetricsConfig(str(directory), sinks=("jsonl",)), timers=log_timers, rank=0, world_size=1,
                               console=False)
        gather_best = log_step_best = float("inf")
        for iteration in range(1, options.intervals + 1):
            for name in names:
                log_timers(name, log_level=0).start()
                log_timers(name).stop()
            start = time.perf_counter()
            log_timers.gather(names, reset=False)
            gather_best = min(gather_best, time.perf_counter() - start)
            start = time.perf_counter()
            writer.log_step(iteration, names=names, extra={"flush_seconds": 0.1, "trace_mb": 2.0})
            log_step_best = min(log_step_best, time.perf_counter() - start)
        writer.close()
    bare_interval = bare * len(names) / 1e3
    print(f"\none log interval, {len(names)} timers, single process, best of {options.intervals}")
    print(f"{'bare: 8 perf_counter pairs':44s} {bare_interval:8.1f} us")
    print(f"{'Timers.gather (read + reset 8 timers)':44s} {gather_best * 1e6:8.1f} us")
    print(f"{'MetricsWriter.log_step -> metrics.jsonl':44s} {log_step_best * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
