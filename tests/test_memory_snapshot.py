"""Memory snapshots: the CPU ("needs CUDA") path for real, the dump path with an injected
snapshot provider (no GPU here), naming, atomic writes and OOM re-raise."""

from __future__ import annotations

import argparse
import logging
import pickle
import re
from pathlib import Path

import pytest
import torch
from helpers.cuda import cpu_only

from torchprof_args import TorchProfileArgsError, add_torch_profile_args, configs_from_args
from torchprof_args.capture.runtime.config import MemorySnapshotConfig
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter, write_snapshot
from torchprof_args.naming import memory_snapshot_name as snapshot_file_name


def _parse(*argv: str) -> argparse.Namespace:
    return add_torch_profile_args(argparse.ArgumentParser()).parse_args(list(argv))


class FakeAllocator:
    """Stands in for the CUDA allocator where only CUDA can answer: records what it was asked
    and returns a snapshot-shaped dict."""

    def __init__(self) -> None:
        self.record_calls: list[dict] = []
        self.snapshots = 0

    def record(self, **kwargs) -> None:
        self.record_calls.append(kwargs)

    def snapshot(self) -> dict:
        self.snapshots += 1
        return {"segments": [{"device": 0, "total_size": 2 << 20, "blocks": []}],
                "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "frames": []}]],
                "n": self.snapshots}


def snapshot_config(directory: Path, **options) -> MemorySnapshotConfig:
    return MemorySnapshotConfig(enabled=True, output_dir=str(directory), **options)


def _with_cuda(tmp_path: Path, **options) -> tuple[MemorySnapshotter, FakeAllocator]:
    fake = FakeAllocator()
    snap = MemorySnapshotter(snapshot_config(tmp_path, **options), rank=3, host="node7.cluster",
                             cuda_available=True, snapshot_fn=fake.snapshot, record_fn=fake.record)
    return snap, fake


@cpu_only
def test_cpu_only_warns_once_and_writes_nothing(tmp_path: Path, logs) -> None:
    snap = MemorySnapshotter.from_args(_parse("--torch-profile-memory-snapshot",
                                              "--torch-profile-memory-snapshot-interval", "1",
                                              "--torch-profile-dir", str(tmp_path)), rank=0)
    snap.start()
    for iteration in range(1, 5):
        with snap.guard(iteration):
            pass
        assert snap.on_step(iteration, profiled_cycle_ended=True) is None
    assert snap.on_oom(5) is None
    snap.close()
    warnings = logs.at(logging.WARNING)
    assert len(warnings) == 1
    assert "needs CUDA" in warnings[0] and "rank 0" in warnings[0]
    assert not list(tmp_path.rglob("*"))


@cpu_only
def test_cpu_only_oom_is_re_raised(tmp_path: Path) -> None:
    snap = MemorySnapshotter(snapshot_config(tmp_path), rank=0)
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.OutOfMemoryError) as caught, snap.guard(9):
        raise error
    assert caught.value is error
    assert not list(tmp_path.rglob("*"))


def test_dumps_at_cycle_end_interval_and_oom(tmp_path: Path, logs) -> None:
    snap, fake = _with_cuda(tmp_path, interval=3, max_entries=5000, stacks="python")
    snap.start()
    assert fake.record_calls == [
        {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000}]
    written = [snap.on_step(i, profiled_cycle_ended=(i == 4)) for i in range(1, 8)]
    assert [Path(p).name if p else None for p in written] == [
        None, None,
        "memory_snapshot_node7_rank3_iter0000003.pickle",
        "memory_snapshot_node7_rank3_iter0000004.pickle",
        None,
        "memory_snapshot_node7_rank3_iter0000006.pickle",
        None,
    ]
    error = torch.OutOfMemoryError("CUDA out of memory.")
    with pytest.raises(torch.OutOfMemoryError) as caught, snap.guard():
        raise error
    assert caught.value is error
    oom = tmp_path / "memory_snapshot_node7_rank3_iter0000008_oom.pickle"  # the step after on_step(7)
    assert oom.exists()
    # Other errors are not OOMs: no dump, still raised.
    with pytest.raises(ValueError), snap.guard(9):
        raise ValueError("not memory")
    snap.close()
    assert fake.record_calls[-1] == {"enabled": None}
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted([Path(p).name for p in written if p] + [oom.name])  # no temp files left
    with open(oom, "rb") as handle:
        assert handle.read(2) == b"\x80\x04"  # pickle protocol 4
    with open(oom, "rb") as handle:
        loaded = pickle.load(handle)
    assert loaded["n"] == 4 and loaded["segments"][0]["total_size"] == 2 << 20
    assert not logs.at(logging.WARNING) and not logs.at(logging.ERROR)


def test_guard_as_decorator_and_wrap(tmp_path: Path) -> None:
    snap, fake = _with_cuda(tmp_path)
    snap.start()
    snap.on_step(41)

    @snap.guard()
    def step() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory.")

    with pytest.raises(torch.OutOfMemoryError):
        step()
    assert fake.snapshots == 1
    with pytest.raises(torch.OutOfMemoryError):
        snap.wrap(step)()  # nested guards: one dump per error
    assert fake.snapshots == 2  # the second OOM dump replaced the first, atomically
    assert [p.name for p in tmp_path.iterdir()] == ["memory_snapshot_node7_rank3_iter0000042_oom.pickle"]


def test_failed_snapshot_is_logged_not_raised(tmp_path: Path, logs) -> None:
    def broken() -> dict:
        raise RuntimeError("allocator busy")

    snap = MemorySnapshotter(snapshot_config(tmp_path), rank=0, host="h", cuda_available=True,
                             snapshot_fn=broken, record_fn=lambda **_: None)
    snap.start()
    assert snap.on_step(1, profiled_cycle_ended=True) is None
    assert any("allocator busy" in m for m in logs.at(logging.ERROR))
    assert not list(tmp_path.iterdir())


def test_write_snapshot_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "s.pickle"
    write_snapshot({"v": 1}, str(target))
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        write_snapshot({"v": 2, "bad": lambda: None}, str(target))  # fails mid-dump
    with open(target, "rb") as handle:
        assert pickle.load(handle) == {"v": 1}  # the old snapshot is intact
    assert [p.name for p in tmp_path.iterdir()] == ["s.pickle"]  # no partial file


def test_snapshot_file_name() -> None:
    name = snapshot_file_name("gpu12.cluster.org", 5, 1200)
    assert name == "memory_snapshot_gpu12_rank5_iter0001200.pickle"
    assert snapshot_file_name("h", 0, 7, "oom") == "memory_snapshot_h_rank0_iter0000007_oom.pickle"
    assert re.fullmatch(r"memory_snapshot_a-b_rank1_iter\d{7}\.pickle", snapshot_file_name("a b", 1, 3))


def test_from_args(tmp_path: Path) -> None:
    args = _parse("--torch-profile-memory-snapshot", "--torch-profile-memory-snapshot-stacks", "ALL",
                  "--torch-profile-memory-snapshot-max-entries", "123",
                  "--torch-profile-ranks", "0", "2", "--torch-profile-dir", str(tmp_path))
    snap = MemorySnapshotter.from_args(args, rank=2)
    assert snap.enabled and snap.config.stacks == "all"
    assert snap.config.max_entries == 123 and snap.interval == 0
    assert snap.output_dir == str(tmp_path / "memory_snapshots")
    defaults = MemorySnapshotter.from_args(_parse("--torch-profile-memory-snapshot"), rank=0)
    assert defaults.config == MemorySnapshotConfig(enabled=True)
    assert defaults.config.stacks == "python" and defaults.config.max_entries == 100_000
    assert not MemorySnapshotter.from_args(_parse(), rank=0).enabled
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-memory-snapshot-interval"):
        MemorySnapshotter.from_args(_parse("--torch-profile-memory-snapshot-interval", "5"))


def test_unselected_rank_is_silent_on_cpu(tmp_path: Path, logs) -> None:
    """The profiler builds a snapshotter only on the ranks it traces: rank 1 says nothing."""
    from torchprof_args import TorchProfiler

    args = _parse("--torch-profile-memory-snapshot", "--torch-profile-ranks", "0", "--torch-profile-dir",
                  str(tmp_path))
    prof = TorchProfiler(configs_from_args(args).profiler, rank=1, world_size=2)
    with prof:
        prof.step(1)
    assert not [r for r in logs.records if r.levelno >= logging.WARNING]
    assert not (tmp_path / "memory_snapshots").exists()


def test_bad_flag_values_are_argparse_errors(capsys) -> None:
    with pytest.raises(SystemExit):
        _parse("--torch-profile-memory-snapshot-stacks", "cpp")
    assert "--torch-profile-memory-snapshot-stacks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse("--torch-profile-memory-snapshot-max-entries", "0")
