"""The timed training loop of the slow-flush jobs (``tests/jobs/flush_job.py`` on gloo,
``tests/jobs/nccl_flush_job.py`` on NCCL): the same steps under the stock torch.profiler or under
``TorchProfiler``, each step's wall time recorded."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from torchprof_args import TorchProfiler


def timed_steps(args: argparse.Namespace, train_step: Callable[[], None], *, stock: bool,
                stock_profiler: torch.profiler.profile | None = None) -> list[float]:
    """Run ``args.iters`` steps; per-step wall seconds.  ``stock``: profiled by ``stock_profiler``
    (a torch.profiler on the ranks it profiles, None on the others), else by
    ``TorchProfiler.from_args(args)`` stepped with global iterations 1..iters."""
    times: list[float] = []
    if not stock:
        with TorchProfiler.from_args(args) as prof:
            for iteration in range(1, args.iters + 1):
                started = time.perf_counter()
                train_step()
                prof.step(iteration)
                times.append(time.perf_counter() - started)
        return times
    if stock_profiler is not None:
        stock_profiler.start()
    for _ in range(args.iters):
        started = time.perf_counter()
        train_step()
        if stock_profiler is not None:
            stock_profiler.step()
        times.append(time.perf_counter() - started)
    if stock_profiler is not None:
        stock_profiler.stop()
    return times
