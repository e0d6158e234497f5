"""CUDA activity in TorchProfiler's traces, read back with the package's own analysis; ten forked
exports in a row with a live CUDA context and CUPTI recording the next window meanwhile."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.cuda import requires_gpus
from helpers.gpu_train import Trainer, parse_flags, train

from torchprof_args import TorchProfiler
from torchprof_args.analysis import load_trace, summarize
from torchprof_args.analysis.collect.trace_results import SUMMARY, read_results

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1)]


def flags(tmp_path: Path, *argv: str):
    return parse_flags("--torch-profile", "--torch-profile-dir", str(tmp_path / "prof"), *argv)


def step_numbers(trace_path: str) -> list[int]:
    """The CPU-side ``ProfilerStep#N`` ranges (Kineto copies each onto the GPU timeline as a
    ``gpu_user_annotation`` too: those are not counted)."""
    with gzip.open(trace_path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return sorted(
        int(e["name"].split("#")[1])
        for e in events
        if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
    )


@pytest.mark.timeout(180)
def test_window_kernels_are_in_the_trace_and_its_summary(tmp_path: Path) -> None:
    """Skip 2, warm up 1, record iterations 4-6: the published trace holds those steps and their
    kernels; ``summarize`` (and the publisher's sidecar) give GPU kernel time > 0."""
    prof = TorchProfiler.from_args(
        flags(tmp_path, "--torch-profile-skip-first", "2", "--torch-profile-active", "3")
    )
    train(prof, Trainer(), range(1, 9))
    (published,) = prof.published_traces
    assert step_numbers(published) == [4, 5, 6]
    trace = load_trace(published)
    summary = summarize(trace)
    gpu = summary.gpu
    assert gpu is not None, "no CUDA kernels in the trace"
    assert gpu.kernels > 0 and gpu.busy_us > 0 and gpu.compute_us > 0, gpu
    assert summary.top_kernels and summary.top_kernels[0].total_us > 0
    assert {k.type for k in summary.top_kernels} & {"computation"}
    assert summary.top_ops_by_device, "no CPU operator is linked to device time"
    devices = trace.metadata.get("deviceProperties") or []
    assert torch.cuda.get_device_name(0) in {d.get("name") for d in devices}, devices
    sidecar = read_results(published, (SUMMARY,))
    assert sidecar is not None and sidecar.summary is not None, "the publisher wrote no summary sidecar"
    assert sidecar.summary.gpu is not None and sidecar.summary.gpu.kernels == gpu.kernels


@pytest.mark.timeout(300)
def test_ten_forked_exports_with_live_cuda_and_cupti(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten one-step windows, each exported by a forked child while the parent trains and CUPTI
    records the next window.

    What "no CUDA call in the child" is checked by: every export ran in a child (not the
    parent, not inline) in which torch knows it is a fork of an initialised CUDA process
    (``torch.cuda._is_in_bad_fork()``), where every Python-level CUDA entry point raises
    "Cannot re-initialize CUDA in forked subprocess"; every export finished and wrote a whole
    trace.  A CUDA driver call made from C++ inside Kineto's serialiser would not be seen here.
    """
    children = tmp_path / "children"
    children.mkdir()
    parent = os.getpid()
    export = torch.profiler.profile.export_chrome_trace

    def export_and_note(self: torch.profiler.profile, path: str, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = export(self, path, *args, **kwargs)
        note = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "bad_fork": torch.cuda._is_in_bad_fork(),
            "seconds": time.monotonic() - started,
        }
        (children / f"{os.getpid()}.json").write_text(json.dumps(note))
        return result

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", export_and_note)
    prof = TorchProfiler.from_args(  # no backpressure: every window is recorded, however fast the GPU
        flags(
            tmp_path, "--torch-profile-repeat", "10", "--torch-profile-export", "fork",
            "--torch-profile-max-publishing", "0",
        )
    )  # fmt: skip
    trainer = Trainer()
    started = time.monotonic()
    train(prof, trainer, range(1, 23))
    seconds = time.monotonic() - started
    notes = [json.loads(p.read_text()) for p in children.iterdir()]
    assert len(notes) == 10, f"{len(notes)} exports ran in a child, expected 10: {notes}"
    assert all(n["ppid"] == parent and n["pid"] != parent for n in notes), notes
    assert all(n["bad_fork"] for n in notes), "a child did not see the parent's CUDA context"
    published = sorted(prof.published_traces)
    assert len(published) == 10 and prof.stats["traces_written"] == 10, (published, prof.stats)
    assert sorted(n for p in published for n in step_numbers(p)) == list(range(3, 22, 2))
    for path in published:
        gpu = summarize(load_trace(path)).gpu
        assert gpu is not None and gpu.kernels > 0, f"{path}: no kernels"
    # The parent's CUDA context is intact after ten forks.
    probe = torch.arange(1 << 20, device="cuda", dtype=torch.float64)
    assert float(probe.sum().item()) == float((1 << 20) * ((1 << 20) - 1) // 2)
    assert seconds < 240, f"22 small steps with 10 flushes took {seconds:.0f} s"
