"""Cost of torchprof_args.Timers on CPU against a bare ``time.perf_counter`` pair, side by side,
and of one log interval's gather across 2, 4 and 8 gloo ranks, before and after.

    python benchmarks/bench_timers.py [--pairs 200000] [--repeats 5] [--ranks 2 4 8] [--gathers 300]

Rows (best of --repeats, nanoseconds per start/stop pair):
  bare perf_counter pair      t0 = perf_counter(); t1 = perf_counter(); acc += t1 - t0
  Timer object start/stop     timer.start(); timer.stop()           (timer kept in a variable)
  timers(name) lookup + pair  timers("fwd").start(); timers("fwd").stop()  (Megatron's usage)
  dummy timer (level > log)   timers("off").start(); timers("off").stop()
and the cost of one log interval (Timers.gather of 8 timers + MetricsWriter.log_step to
metrics.jsonl) in microseconds.  Target: under 2 microseconds per pair above the bare pair.

Then, for each --ranks count, a real gloo job (torchrun, CPU) times one log interval's gather of
8 timers plus 6 per-rank figures (what MetricsWriter sends) with the previous implementation
(``all_gather_object`` of the readings: pickling, two collectives) and the current one (one
fixed-size float64 all-gather after a one-time agreement), interleaved in blocks of 20 intervals.
An interval's cost is the slowest rank's wall time for the gather; the table shows the median
and 90th percentile over --gathers intervals each, and the ratio.

``--interval-ranks 2 4 8`` instead times one whole log interval (``MetricsWriter.log_step`` with 8
timers, writing metrics.jsonl) on gloo ranks, with the allocator and GPU hardware fields of issue 19
when the code has them (a stand-in NVML module and memory_stats: this machine has no GPU): the
slowest rank's wall time (median, p90 over --gathers intervals) and the collectives per interval.
Run it on main's code for "before" (same script, ``PYTHONPATH`` a checkout of main).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchprof_args.capture.metrics.config import MetricsConfig  # noqa: E402
from torchprof_args.capture.metrics.timers import Timers  # noqa: E402
from torchprof_args.capture.metrics.writer import MetricsWriter  # noqa: E402


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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--intervals", type=int, default=200)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="gloo world sizes to time")
    parser.add_argument("--gathers", type=int, default=300, help="timed intervals per implementation")
    parser.add_argument("--interval-ranks", type=int, nargs="+", help="time whole log intervals instead")
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--interval-worker", metavar="DIR", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        return gather_worker(options.worker, options.gathers)
    if options.interval_worker:
        return interval_worker(options.interval_worker, options.gathers)
    if options.interval_ranks:
        bench_intervals_across_ranks(options.interval_ranks, options.gathers)
        return 0

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
        writer = MetricsWriter(MetricsConfig(str(directory), sinks=("jsonl",)), timers=log_timers, rank=0,
                               world_size=1, console=False)
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
    if options.ranks:
        bench_gather_across_ranks(options.ranks, options.gathers)
    return 0


# ---------------------------------------------------------------------------------------------
# One log interval across gloo ranks: all_gather_object (before) vs the fixed-size gather (after)

TIMER_NAMES = [f"timer-{i}" for i in range(8)]
FIGURES = ("iteration-time", "memory/host-max-rss-gb", "profiler/flush_seconds", "profiler/trace_mb",
           "profiler/traces_written", "profiler/published")
BLOCK = 20


def legacy_gather(dist, timers: Timers, names: list[str], per_rank: dict) -> list:
    """The previous ``Timers.gather`` for explicit names: one ``all_gather_object`` of
    (fingerprint, readings, payload) -- pickled, two collectives (sizes, then bytes)."""
    import zlib

    local = [timers._timers[name]._elapsed_for_gather(True) for name in names]
    key = zlib.crc32("\x00".join(names).encode("utf-8"))
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (key, local, per_rank))
    return gathered


def gather_worker(result_dir: str, gathers: int) -> int:
    """One rank of the timed job (run under torchrun): writes its per-interval seconds."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    timers = Timers(0, "minmax", device="cpu")
    figures = {key: float(rank + i) for i, key in enumerate(FIGURES)}
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    implementations = {
        "before": lambda: legacy_gather(dist, timers, TIMER_NAMES, figures),
        "after": lambda: timers.gather(TIMER_NAMES, per_rank=figures),
    }
    for _warmup in range(5):
        for run in implementations.values():
            _tick(timers)
            run()
    for _ in range(math.ceil(gathers / BLOCK)):
        for label, run in implementations.items():
            for _ in range(BLOCK):
                _tick(timers)
                dist.barrier()
                start = time.perf_counter()
                run()
                seconds[label].append(time.perf_counter() - start)
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"rank": rank, **seconds, "collectives": timers._rank_gather.collectives}, handle)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _tick(timers: Timers) -> None:
    for name in TIMER_NAMES:
        timers(name, log_level=0).start()
        timers(name).stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_gather_across_ranks(world_sizes: list[int], gathers: int) -> None:
    print(f"\none log interval across gloo ranks (8 timers + {len(FIGURES)} per-rank figures), "
          f"slowest rank's wall time, {gathers} intervals each, interleaved in blocks of {BLOCK}")
    print(f"{'ranks':>5s} {'before: all_gather_object':>26s} {'after: fixed-size tensor':>26s} {'ratio':>7s}")
    print(f"{'':5s} {'median':>12s} {'p90':>13s} {'median':>12s} {'p90':>13s} {'(median)':>7s}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for world in world_sizes:
        with tempfile.TemporaryDirectory() as directory:
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
                       "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
                       str(Path(__file__).resolve()), "--worker", directory, "--gathers", str(gathers)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                print(f"{world:5d} failed: {done.stderr[-2000:]}")
                continue
            results = [json.loads(Path(directory, f"rank{r}.json").read_text()) for r in range(world)]
        row = []
        for label in ("before", "after"):
            slowest = [max(result[label][i] for result in results) for i in range(len(results[0][label]))]
            cuts = statistics.quantiles(slowest, n=10)
            row.append((statistics.median(slowest) * 1e6, cuts[-1] * 1e6))
        (before, before90), (after, after90) = row
        print(f"{world:5d} {before:9.0f} us {before90:10.0f} us {after:9.0f} us {after90:10.0f} us "
              f"{before / after:6.2f}x")


# ---------------------------------------------------------------------------------------------
# One whole log interval across gloo ranks, with the allocator and hardware fields when present


class _StandInNvml:
    """Answers NVML's calls with fixed readings (the benchmark machine has no GPU)."""

    NVML_CLOCK_SM = NVML_TEMPERATURE_GPU = NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __getattr__(self, name: str):  # noqa: ANN204
        if name == "nvmlEventSetWait":
            def timeout(*args):  # noqa: ANN202
                raise TimeoutError("no event")
            return timeout
        values = {"nvmlDeviceGetClockInfo": 1980, "nvmlDeviceGetPowerUsage": 650_000,
                  "nvmlDeviceGetTemperature": 61, "nvmlDeviceGetCurrentClocksThrottleReasons": 0,
                  "nvmlDeviceGetTotalEccErrors": 0}
        return lambda *args: values.get(name, 0)


def _inject_readings(writer: MetricsWriter) -> int:
    """Stand-in readings on this branch's writer; returns how many fields they add (0 on main)."""
    try:
        from torchprof_args.capture.metrics.hardware import DeviceReadings
    except ImportError:
        return 0
    stats = {"allocated_bytes.all.peak": 30 * 2**30, "reserved_bytes.all.peak": 34 * 2**30,
             "num_alloc_retries": 0, "num_ooms": 0}
    writer.readings = DeviceReadings(memory_stats=lambda: stats, nvml=_StandInNvml())
    return len(writer.readings.read())


def interval_worker(result_dir: str, intervals: int) -> int:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    timers = Timers(0, "minmax", device="cpu")
    writer = MetricsWriter(MetricsConfig(os.path.join(result_dir, "metrics"), sinks=("jsonl",)),
                           timers=timers, console=False)
    fields = _inject_readings(writer)
    seconds, collectives = [], []
    for iteration in range(1, intervals + 6):
        _tick(timers)
        dist.barrier()
        before, start = timers._rank_gather.collectives, time.perf_counter()
        writer.log_step(iteration, names=TIMER_NAMES, extra={"flush_seconds": 0.1, "trace_mb": 2.0})
        if iteration > 5:  # after the warm-up (and the one-time agreement)
            seconds.append(time.perf_counter() - start)
            collectives.append(timers._rank_gather.collectives - before)
    writer.close()
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"rank": rank, "seconds": seconds, "collectives": collectives, "fields": fields}, handle)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def bench_intervals_across_ranks(world_sizes: list[int], intervals: int) -> None:
    print(f"one log interval (MetricsWriter.log_step, 8 timers, metrics.jsonl) across gloo ranks, "
          f"slowest rank's wall time over {intervals} intervals")
    print(f"{'ranks':>5s} {'hw fields':>9s} {'median':>10s} {'p90':>10s} {'collectives/interval':>21s}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    for world in world_sizes:
        with tempfile.TemporaryDirectory() as directory:
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
                       "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
                       str(Path(__file__).resolve()), "--interval-worker", directory,
                       "--gathers", str(intervals)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                print(f"{world:5d} failed: {done.stderr[-2000:]}")
                continue
            results = [json.loads(Path(directory, f"rank{r}.json").read_text()) for r in range(world)]
        count = len(results[0]["seconds"])
        slowest = [max(result["seconds"][i] for result in results) for i in range(count)]
        cuts = statistics.quantiles(slowest, n=10)
        counts = sorted({c for result in results for c in result["collectives"]})
        print(f"{world:5d} {results[0]['fields']:9d} {statistics.median(slowest) * 1e6:7.0f} us "
              f"{cuts[-1] * 1e6:7.0f} us {','.join(map(str, counts)):>21s}")


if __name__ == "__main__":
    raise SystemExit(main())
