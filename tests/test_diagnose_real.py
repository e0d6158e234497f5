"""Per-rank findings on real torch.profiler traces recorded here (CPU), where the problem is real."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.diagnose.rank import rank_findings

SLEEP_S, BATCH = 0.01, 4


@pytest.mark.slow
def test_a_slow_data_loader_is_found(tmp_path: Path) -> None:
    """A dataset that sleeps 10 ms per sample, 4 samples a batch, no loader workers: every step
    waits at least 40 ms for its batch, and the finding says so (the GPU kinds are gaps)."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    class SlowDataset(Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int):
            time.sleep(SLEEP_S)
            return torch.randn(32), torch.randn(1)

    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "trace.json"
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for i, (x, y) in enumerate(DataLoader(SlowDataset(), batch_size=BATCH)):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
            if i == 5:
                break
    results = rank_findings(load_trace(out))
    found = {r.kind: r for r in results if isinstance(r, Finding)}
    assert list(found) == ["dataloader_stall"]
    stall = found["dataloader_stall"]
    assert stall.ms_per_step >= SLEEP_S * BATCH * 1000.0
    assert stall.share_of_step > 0.5 and stall.evidence["fetches_per_step"] == 1.0
    assert {r.kind for r in results if not isinstance(r, Finding)} == {
        "gpu_idle", "exposed_comm", "launch_bound", "host_sync", "low_mfu", "memcpy"}
