"""TorchProfiler drives the memory-snapshot and nsys hooks from the same schedule.

CUDA's allocator and profiler API do not exist on this machine, so the hooks get the stand-in
CUDA functions their own tests use; the profiler, schedule and traces are real."""

from __future__ import annotations

import argparse
import os

import pytest
import torch
from helpers.cuda import cpu_only
from test_memory_snapshot import FakeAllocator
from test_nsys import CallLog

from torchprof_args import TorchProfileArgsError, TorchProfiler, add_torch_profile_args, validate_args
from torchprof_args.capture.runtime.config import (
    ExportConfig,
    MemorySnapshotConfig,
    NsysConfig,
    ProfilerConfig,
    TraceConfig,
)
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter
from torchprof_args.capture.runtime.nsys import NsysController
from torchprof_args.capture.runtime.schedule import ProfileSchedule


def profiler_config(tmp_path, schedule: ProfileSchedule, *, record: bool = False, operator_table: bool = True,
                    memory: bool = False, nsys: bool = False) -> ProfilerConfig:
    """A profiler config as the flags would give, with the stand-ins' features switched on."""
    return ProfilerConfig(
        trace=TraceConfig(enabled=record, schedule=schedule, output_dir=str(tmp_path / "prof")),
        export=ExportConfig(operator_table_rows=30 if operator_table else None),
        memory=MemorySnapshotConfig(enabled=memory), nsys=NsysConfig(enabled=nsys))


def run_loop(prof: TorchProfiler, iterations: range, oom_at: int | None = None) -> None:
    model = torch.nn.Linear(16, 16)
    with prof:
        for iteration in iterations:
            if iteration == oom_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            model(torch.randn(4, 16)).sum().backward()
            prof.step(iteration)


@pytest.mark.slow
def test_snapshots_at_flushes_and_on_oom(tmp_path):
    fake = FakeAllocator()
    memory = MemorySnapshotter(MemorySnapshotConfig(enabled=True, output_dir=str(tmp_path / "snap")), rank=0,
                               host="node1", cuda_available=True, snapshot_fn=fake.snapshot,
                               record_fn=fake.record)
    prof = TorchProfiler(profiler_config(tmp_path, ProfileSchedule(active=2, repeat=2), record=True,
                                         operator_table=False),
                         rank=0, world_size=1, memory=memory)
    with pytest.raises(torch.OutOfMemoryError):
        run_loop(prof, range(1, 12), oom_at=10)
    names = sorted(os.listdir(tmp_path / "snap"))
    # cycles: skip 1, warmup 2, record 3-4 (flush at 4); warmup 5, record 6-7 (flush at 7); OOM in 10
    assert names == ["memory_snapshot_node1_rank0_iter0000004.pickle",
                     "memory_snapshot_node1_rank0_iter0000007.pickle",
                     "memory_snapshot_node1_rank0_iter0000010_oom.pickle"]
    assert fake.record_calls[0]["stacks"] == "python"
    assert len(prof.published_traces) == 2


def test_nsys_capture_follows_the_recorded_steps(tmp_path):
    backend = CallLog()
    nsys = NsysController(backend=backend, cuda_available=True)
    prof = TorchProfiler(profiler_config(tmp_path, ProfileSchedule(active=2, skip_first=1, warmup=1),
                                         nsys=True),
                         rank=0, world_size=1, nsys=nsys)
    run_loop(prof, range(1, 7))
    starts = [i for i, call in enumerate(backend.calls) if call == "start"]
    stops = [i for i, call in enumerate(backend.calls) if call == "stop"]
    assert len(starts) == 1 and len(stops) == 1
    captured = [c for c in backend.calls[starts[0]:stops[0]] if c.startswith("push step")]
    assert captured == ["push step 3", "push step 4"]


@pytest.mark.slow
@cpu_only
def test_memory_snapshot_on_cpu_warns_once_and_training_goes_on(tmp_path, caplog):
    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args(["--torch-profile", "--torch-profile-memory-snapshot", "--torch-profile-nsys",
                              "--torch-profile-dir", str(tmp_path), "--no-torch-profile-operator-table"])
    prof = TorchProfiler.from_args(args)
    run_loop(prof, range(1, 6))
    assert len(prof.published_traces) == 1
    assert caplog.text.count("needs CUDA") >= 1
    assert not (tmp_path / "memory_snapshots").exists() or not os.listdir(tmp_path / "memory_snapshots")


def test_memory_snapshot_options_need_the_main_flag():
    parser = add_torch_profile_args(argparse.ArgumentParser())
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-memory-snapshot-interval"):
        validate_args(parser.parse_args(["--torch-profile-memory-snapshot-interval", "5"]), world_size=1)


def test_interval_snapshots_between_cycles(tmp_path):
    """Idle steps take the fast path; the planner still stops at every multiple of the interval."""
    fake = FakeAllocator()
    memory = MemorySnapshotter(MemorySnapshotConfig(enabled=True, output_dir=str(tmp_path / "snap"),
                                                    interval=3),
                               rank=0, host="node1", cuda_available=True, snapshot_fn=fake.snapshot,
                               record_fn=fake.record)
    prof = TorchProfiler(profiler_config(tmp_path, ProfileSchedule(skip_first=100), memory=True), rank=0,
                         world_size=1, memory=memory)
    run_loop(prof, range(1, 11))
    assert sorted(os.listdir(tmp_path / "snap")) == [
        f"memory_snapshot_node1_rank0_iter{i:07d}.pickle" for i in (3, 6, 9)]
