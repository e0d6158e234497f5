"""``torchprof mem`` on snapshots a GPU wrote: real OOMs explained (a small model's and a ~1B GPT's),
fragmentation with and without ``expandable_segments``, a long history read back.  Skipped without
CUDA (``make gpu-check``'s memory section runs the same and keeps small snapshots for tests/data)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.cuda import requires_gpus
from helpers.demo_model import TinyGPT
from helpers.gpu_train import Trainer
from helpers.processes import subprocess_env

from torchprof_args import console
from torchprof_args.capture.runtime.config import MemorySnapshotConfig
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1), pytest.mark.timeout(600)]
MIB = 1 << 20


def mem(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert console.main(["mem", "--json", str(path)]) == 0
    return json.loads(capsys.readouterr().out)


def snapshotter(directory: Path, max_entries: int = 100_000) -> MemorySnapshotter:
    return MemorySnapshotter(
        MemorySnapshotConfig(enabled=True, output_dir=str(directory), max_entries=max_entries),
        rank=0,
        host="gpu",
    )


def check_explained(oom: dict, params_bytes: int) -> None:
    """What every real OOM's explanation must hold."""
    assert oom["requested_bytes"] > 0 and oom["device_free_bytes"] is not None, oom
    assert oom["cause"] in ("fragmentation", "demand")
    assert abs(oom["held"]["parameter"] - params_bytes) <= 0.1 * params_bytes, (oom["held"], params_bytes)
    if oom["cause"] == "demand":
        assert oom["missing_bytes"] > 0
        if oom["remedy"] is not None:
            assert oom["remedy"]["bytes_freed"] >= oom["missing_bytes"]
        else:
            assert not any(r["enough"] for r in oom["remedies"])
    else:
        assert oom["remedy"]["kind"] == "fragmentation"


def test_a_small_models_oom_in_a_training_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ballast leaves 256 MiB; a step with a large micro-batch runs out in the forward or backward pass."""
    snap = snapshotter(tmp_path)
    with snap.session():
        trainer = Trainer(batch=8)
        trainer.step()
        params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        free, _ = torch.cuda.mem_get_info()
        ballast = torch.empty(free - 256 * MIB, dtype=torch.uint8, device="cuda")
        big = Trainer(batch=512)
        params += sum(p.numel() * p.element_size() for p in big.model.parameters())
        with pytest.raises(torch.OutOfMemoryError), snap.guard(2):
            big.step()
        del ballast
    (path,) = tmp_path.glob("*_oom.pickle")
    doc = mem(path, capsys)
    check_explained(doc["oom"], params)
    assert doc["oom"]["held"]["other"] >= free - 256 * MIB - MIB  # the ballast: a stack of no category


def test_a_1b_gpts_oom_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo GPT at ~1.08B parameters (bf16, AdamW), its micro-batch doubled until a step runs
    out of memory: the failing request, the free memory and a remedy that frees the missing bytes."""
    snap = snapshotter(tmp_path, max_entries=200_000)
    vocab, seq = 32000, 2048
    with snap.session():
        model = TinyGPT(vocab=vocab, hidden=2048, layers=20, heads=16, seq_len=seq).to("cuda", torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        batch = 4
        for iteration in range(1, 12):
            tokens = torch.randint(0, vocab, (batch, seq + 1), device="cuda")
            try:
                with snap.guard(iteration):
                    logits = model(tokens[:, :-1])
                    torch.nn.functional.cross_entropy(
                        logits.reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1)
                    ).backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            except torch.OutOfMemoryError:
                break
            del logits
            batch *= 2
        else:
            pytest.fail(f"no OOM up to micro-batch {batch}")
    (path,) = tmp_path.glob("*_oom.pickle")
    oom = mem(path, capsys)["oom"]
    check_explained(oom, params)
    assert oom["held"]["activation"] + oom["held"]["other"] > 0


FRAGMENT = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from torchprof_args.capture.runtime.config import MemorySnapshotConfig
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter
snap = MemorySnapshotter(MemorySnapshotConfig(enabled=True, output_dir=sys.argv[1]), rank=0, host="gpu")
mib = 1 << 20
with snap.session():
    blocks = [torch.empty((3 if i % 2 else 5) * mib, dtype=torch.uint8, device="cuda") for i in range(1000)]
    del blocks[::2]
    more = [torch.empty(7 * mib, dtype=torch.uint8, device="cuda") for _ in range(100)]
    torch.cuda.synchronize()
    print(snap.dump(1))
"""


def test_fragmentation_with_and_without_expandable_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same pattern (interleaved 3 / 5 MiB blocks, every other freed, then 7 MiB requests) in two
    fresh processes: the snapshot says which allocator ran, and expandable segments cache no more
    free memory than the default's fixed segments."""
    states = {}
    for expandable in (False, True):
        folder = tmp_path / f"expandable_{expandable}"
        folder.mkdir()
        env = subprocess_env(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" if expandable else "")
        run = subprocess.run(
            [sys.executable, "-c", FRAGMENT, str(folder), str(Path.cwd())],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        states[expandable] = mem(Path(run.stdout.strip().splitlines()[-1]), capsys)["snapshots"][0][
            "devices"
        ][0]
    assert states[False]["expandable_segments"] is False and states[True]["expandable_segments"] is True
    assert states[True]["cached_free_bytes"] <= states[False]["cached_free_bytes"], states


def test_a_long_history_is_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """200,000 history entries of real steps (gpu-check reads 1M and times it)."""
    snap = snapshotter(tmp_path, max_entries=200_000)
    with snap.session():
        trainer = Trainer()
        while len(torch.cuda.memory._snapshot()["device_traces"][0]) < 200_000:
            for _ in range(20):
                trainer.step()
        path = snap.dump(1)
    doc = mem(Path(path), capsys)
    (device,) = [d for d in doc["snapshots"][0]["devices"] if d["device"] == torch.cuda.current_device()]
    assert device["history_events"] == 200_000 and doc["snapshots"][0]["memory"][0]["peak_bytes"] > 0
    assert os.path.getsize(path) > 0
