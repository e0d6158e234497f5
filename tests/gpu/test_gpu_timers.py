"""CUDA-event step timers against ``--timing-synchronize`` readings of the same GPU work.

The work is ``torch.cuda._sleep``: a kernel that spins for a number of GPU clock cycles, calibrated
here (H100 and H200 clocks differ), so the device time is known and the host is idle.
"""

from __future__ import annotations

import time

import pytest
import torch
from helpers.cuda import requires_gpus
from helpers.gpu_train import parse_flags

from torchprof_args.capture.metrics.timer_kinds import CudaEventTimer, SynchronizingTimer
from torchprof_args.capture.metrics.timers import Timers

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1), pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def gpu_sleep():
    """``gpu_sleep(seconds)`` enqueues a kernel that keeps the GPU busy that long (calibrated)."""
    torch.cuda.init()
    cycles = 20_000_000
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # first launch: module loading
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    stop.record()
    stop.synchronize()
    per_second = cycles / (start.elapsed_time(stop) / 1000.0)

    def sleep(seconds: float) -> None:
        torch.cuda._sleep(int(per_second * seconds))

    return sleep


def test_flags_pick_event_timers_or_synchronizing_timers() -> None:
    events = Timers.from_args(parse_flags())
    synced = Timers.from_args(parse_flags("--timing-synchronize"))
    assert events.device == "cuda" and synced.device == "cuda"
    assert isinstance(events("step", log_level=0), CudaEventTimer)
    assert isinstance(synced("step", log_level=0), SynchronizingTimer)


def test_event_timer_agrees_with_the_synchronizing_timer(gpu_sleep) -> None:
    """Nested around the same kernels, the event timer reads the device time: at most the
    synchronizing timer's host time, and within 10 % of it for ~0.3 s of device work."""
    event_timer = Timers.from_args(parse_flags())("step", log_level=0)
    sync_timer = Timers.from_args(parse_flags("--timing-synchronize"))("step", log_level=0)
    targets = (0.02, 0.05, 0.1, 0.12)
    for seconds in targets:
        sync_timer.start()
        event_timer.start()
        gpu_sleep(seconds)
        event_timer.stop()
        sync_timer.stop()
    by_events, by_sync = event_timer.elapsed(), sync_timer.elapsed()
    assert by_events <= by_sync + 1e-3, (by_events, by_sync)
    assert by_events >= 0.9 * by_sync, (by_events, by_sync)
    assert abs(by_events - sum(targets)) <= 0.15 * sum(targets), (by_events, sum(targets))


def test_event_timer_does_not_block_the_host(gpu_sleep) -> None:
    """start/stop only record events: the host is back long before the GPU finishes; the reading
    (which waits for the stop event) is the device time.  The synchronizing timer blocks."""
    timers = Timers.from_args(parse_flags())
    timer = timers("forward", log_level=0)
    torch.cuda.synchronize()
    started = time.perf_counter()
    timer.start()
    gpu_sleep(0.3)
    timer.stop()
    host = time.perf_counter() - started
    reading = timer.elapsed()
    assert host < 0.1, f"start/stop blocked the host for {host:.3f} s"
    assert reading >= 0.25, reading
    synced = Timers.from_args(parse_flags("--timing-synchronize"))("forward", log_level=0)
    started = time.perf_counter()
    synced.start()
    gpu_sleep(0.3)
    synced.stop()
    assert time.perf_counter() - started >= 0.25


class Scalars:
    """A ``SummaryWriter`` stand-in: keeps what ``Timers.write`` adds."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.values[tag] = value


def test_many_pairs_then_megatron_report_and_write(gpu_sleep) -> None:
    """Over 600 start/stop pairs (past the 256 pending pairs a timer folds in) the totals are the
    device time; Megatron's report and ``write`` show it in ms and seconds."""
    timers = Timers.from_args(parse_flags("--timing-log-level", "1"))
    forward = timers("forward-compute", log_level=0)
    for _ in range(600):
        forward.start()
        gpu_sleep(0.0005)
        forward.stop()
    torch.cuda.synchronize()
    report = timers.get_all_timers_string(["forward-compute"], reset=False)
    assert report is not None and "forward-compute" in report
    writer = Scalars()
    timers.write(["forward-compute"], writer, iteration=10, normalizer=600)
    per_pair = writer.values["timers/forward-compute-time"]
    assert 0.00035 <= per_pair <= 0.002, writer.values  # 0.5 ms of device time (+ launch gaps)
