"""Two gloo ranks log 6 intervals through Timers + MetricsWriter with stand-in NVML and
memory_stats readings: rank 1's GPU is throttled (SM clock 1410 vs 1980 MHz, thermal slowdown) and
slow, and its allocator retries grow in intervals 2-3 and 5.  With argv[2] == "readings-fail", rank 1's
NVML and memory_stats raise on every call from interval 4 on (a driver going away): training goes
on.  Writes rank<R>.json into argv[1]."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch.distributed as dist
from helpers.nvml import StandInNvml, memory_stats

from torchprof_args import MetricsWriter, Timers
from torchprof_args.capture.metrics.config import MetricsConfig
from torchprof_args.capture.metrics.hardware import DeviceReadings

GIB = 2**30


def _raise() -> dict:
    raise RuntimeError("CUDA driver error: unknown error")


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    nvml = StandInNvml(clock=1410 if rank else 1980, power_mw=650_000 + 50_000 * rank,
                       temperature=88 if rank else 61, throttle=0x20 if rank else 0, ecc=0)
    allocator = {"allocated_bytes.all.peak": 30 * GIB, "reserved_bytes.all.peak": 34 * GIB,
                 "num_alloc_retries": 0, "num_ooms": 0}
    timers = Timers(0, "minmax", device="cpu", straggler_intervals=2)
    config = MetricsConfig(str(out / "metrics"), sinks=("jsonl",), log_interval=1,
                           flops_per_iteration=4e12, peak_tflops=10.0)
    writer = MetricsWriter(config, timers=timers, console=False)
    writer.readings = DeviceReadings(memory_stats=memory_stats(allocator), nvml=nvml)
    intervals = []
    failing = len(sys.argv) > 2 and sys.argv[2] == "readings-fail"
    for iteration in range(1, 7):
        if rank == 1 and iteration in (2, 3, 5):
            allocator["num_alloc_retries"] += 3
        if failing and rank == 1 and iteration == 4:
            nvml.readings.clear()  # every NVML query raises from now on
            writer.readings._memory_stats = _raise
        timers("forward-backward", log_level=0).start()
        time.sleep(0.03 if rank else 0.01)
        timers("forward-backward").stop()
        before = timers._rank_gather.collectives
        metrics = writer.log_step(iteration, iteration_time=0.5)
        intervals.append({"collectives": timers._rank_gather.collectives - before, "metrics": metrics})
    writer.close()
    result = {"rank": rank, "intervals": intervals, "stragglers": timers.stragglers.warnings,
              "alloc_warnings": writer.alloc_retries.warnings, "nvml_index": nvml.index}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
