"""CUDA memory snapshots for real: after a profiled cycle, every N iterations, and on a real
``torch.OutOfMemoryError`` caught by the snapshotter's guard (and by TorchProfiler's exit), each
read back by ``torchprof mem``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cuda import requires_gpus
from helpers.gpu_train import Trainer, parse_flags, train

from torchprof_args import TorchProfiler, console
from torchprof_args.analysis.memory.snapshot import load_snapshot
from torchprof_args.capture.runtime.config import MemorySnapshotConfig
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1), pytest.mark.timeout(180)]

#: Files whose frames the live blocks of these tests come from (the model, the trainer, this file).
OUR_FILES = ("model.py", "gpu_train.py", "test_gpu_memory.py")


def torchprof_mem(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    """``torchprof mem --json PATH``'s view of the snapshot (its ``snapshots[0]``)."""
    capsys.readouterr()
    assert console.main(["mem", "--json", "--top", "50", str(path)]) == 0
    return json.loads(capsys.readouterr().out)["snapshots"][0]


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_cycle_and_interval_snapshots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Recording 3-4 and an interval of 3 over 9 iterations: snapshots at 3, 4 (the cycle), 6, 9,
    each a readable allocator state with history and Python stacks from this job's code."""
    prof_dir = tmp_path / "prof"
    prof = TorchProfiler.from_args(
        parse_flags(
            "--torch-profile",
            "--torch-profile-dir",
            str(prof_dir),
            "--torch-profile-active",
            "2",
            "--torch-profile-memory-snapshot",
            "--torch-profile-memory-snapshot-interval",
            "3",
            "--torch-profile-memory-snapshot-max-entries",
            "50000",
            "--no-torch-profile-summary",
        )
    )
    train(prof, Trainer(), range(1, 10))
    snapshots = prof_dir / "memory_snapshots"
    host = names(snapshots)[0].split("_rank")[0]
    assert names(snapshots) == [f"{host}_rank0_iter{i:07d}.pickle" for i in (3, 4, 6, 9)]
    for path in sorted(snapshots.iterdir()):
        summary = torchprof_mem(path, capsys)
        (device,) = [d for d in summary["devices"] if d["device"] == torch.cuda.current_device()]
        assert device["reserved_bytes"] >= device["allocated_bytes"] > 0, device
        assert device["history_events"] > 0 and device["peak_allocated_in_history_bytes"] > 0, device
        sites = [s["site"] for s in summary["top_sites"]]
        assert any(name in site for site in sites for name in OUR_FILES), sites


def test_real_oom_caught_by_the_guard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Asking for twice the GPU's memory raises a real OutOfMemoryError: the guard dumps
    ``..._oom.pickle`` (whose history ends with the allocator's ``oom`` event) and re-raises."""
    snap = MemorySnapshotter(
        MemorySnapshotConfig(enabled=True, output_dir=str(tmp_path), max_entries=20000),
        rank=0,
        host="gpuhost",
    )
    live = None
    with snap.session():
        live = torch.ones(16 << 20, device="cuda")  # 64 MiB that stay allocated
        too_big = 2 * torch.cuda.get_device_properties(0).total_memory
        with pytest.raises(torch.OutOfMemoryError), snap.guard(7):
            torch.empty(too_big, dtype=torch.uint8, device="cuda")
    path = tmp_path / "memory_snapshot_gpuhost_rank0_iter0000007_oom.pickle"
    assert names(tmp_path) == [path.name]
    (device,) = [
        d for d in torchprof_mem(path, capsys)["devices"] if d["device"] == torch.cuda.current_device()
    ]
    assert device["allocated_bytes"] >= live.numel() * live.element_size(), device
    history = load_snapshot(path)["device_traces"][torch.cuda.current_device()]
    assert "oom" in {entry.get("action") for entry in history}, "no 'oom' event in the allocator history"


def test_oom_leaving_the_profiler_is_dumped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OOM in iteration 2 (before the default schedule's first cycle ends at 3) escapes
    ``with TorchProfiler``: the snapshot of iteration 2 is dumped before the error goes on, and the
    allocator serves the next step."""
    prof_dir = tmp_path / "prof"
    prof = TorchProfiler.from_args(
        parse_flags("--torch-profile-memory-snapshot", "--torch-profile-dir", str(prof_dir))
    )
    trainer = Trainer()

    def allocate_too_much(iteration: int) -> None:
        if iteration == 2:
            torch.empty(
                2 * torch.cuda.get_device_properties(0).total_memory, dtype=torch.uint8, device="cuda"
            )

    with pytest.raises(torch.OutOfMemoryError):
        train(prof, trainer, range(1, 7), inside=allocate_too_much)
    snapshots = prof_dir / "memory_snapshots"
    (oom,) = list(snapshots.iterdir())
    assert oom.name.endswith("_rank0_iter0000002_oom.pickle"), oom.name
    assert torchprof_mem(oom, capsys)["devices"][0]["allocated_bytes"] > 0
    trainer.step()  # the allocator recovered from the failed request
    torch.cuda.synchronize()
