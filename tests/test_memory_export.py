"""PyTorch's memory categorisation travels from the forked exporter to the sidecar (a staged
companion file), and every way it can fail leaves the trace published, the sidecar's memory part
categorised from the trace with the reason, training going on and nothing in staging."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
import torch

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.analysis.collect.trace_results import MEMORY, read_results
from torchprof_args.analysis.memory import exported, pytorch_profile

pytestmark = pytest.mark.slow

MEMORY_FLAGS = ("--torch-profile-profile-memory", "--torch-profile-record-shapes",
                "--torch-profile-with-stack")


def run(tmp_path: Path, *argv: str, steps: int = 6) -> TorchProfiler:
    """``steps`` steps of a small MLP with Adam, one window of two steps (unless ``argv`` says
    otherwise), published with its sidecar."""
    args = add_torch_profile_args(argparse.ArgumentParser()).parse_args([
        "--torch-profile", "--torch-profile-dir", str(tmp_path / "prof"), "--torch-profile-staging-dir",
        str(tmp_path / "staging"), "--torch-profile-skip-first", "1", "--torch-profile-active", "2", *argv])
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    optimizer = torch.optim.Adam(model.parameters())
    prof = TorchProfiler.from_args(args)
    with prof:
        for iteration in range(1, steps + 1):
            optimizer.zero_grad()
            model(torch.randn(16, 64)).square().mean().backward()
            optimizer.step()
            prof.step(iteration)
    return prof


def memory_part(prof: TorchProfiler) -> object:
    (trace,) = prof.published_traces
    found = read_results(trace, (MEMORY,))
    assert found is not None and found.memory is not None, "no sidecar with a memory part"
    return found.memory


def staging_is_empty(tmp_path: Path) -> bool:
    return not [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]


def test_the_forked_exporter_keeps_pytorchs_categories(tmp_path: Path) -> None:
    prof = run(tmp_path, *MEMORY_FLAGS)
    part = memory_part(prof)
    assert part.source == "pytorch" and part.rank == 0 and part.devices[0].device == "cpu"
    params = 4 * (64 * 128 + 128 + 128 * 64 + 64)
    assert abs(part.devices[0].by_category.parameter - params) <= 0.05 * params
    assert staging_is_empty(tmp_path)


@pytest.mark.parametrize(("when", "sources"), [("first", ["pytorch", "trace", "trace"]),
                                               ("every", ["pytorch"] * 3), ("off", ["trace"] * 3)])
def test_memory_categories_choose_the_windows_the_exporter_categorises(tmp_path: Path, when: str,
                                                                      sources: list[str]) -> None:
    """PyTorch's categorisation costs about 60x the export in the exporter: by default a rank's first
    window only; the later ones are categorised from the trace."""
    # no analysis budget: this test is about which windows PyTorch categorises, not about its time (on a
    # loaded host, or torch 2.9's slower categorisation, it can run past its share and fall back to the
    # trace's: tests/test_analysis_budget.py covers that)
    windows = ("--torch-profile-wait", "1", "--torch-profile-warmup", "0", "--torch-profile-repeat", "3",
               "--torch-profile-max-publishing", "0", "--torch-profile-analysis-budget", "0")
    prof = run(tmp_path, *MEMORY_FLAGS, "--torch-profile-memory-categories", when, *windows, steps=12)
    traces = sorted(prof.published_traces)
    assert len(traces) == 3
    found = [read_results(trace, (MEMORY,)) for trace in traces]
    assert [f.memory.source for f in found if f is not None and f.memory is not None] == sources
    assert staging_is_empty(tmp_path)


def test_without_shapes_and_stacks_the_trace_categorises(tmp_path: Path) -> None:
    """PyTorch's categorisation needs shapes, memory and stacks (as export_memory_timeline): with
    memory alone no companion is written, and the publisher categorises from the trace."""
    part = memory_part(run(tmp_path, "--torch-profile-profile-memory"))
    assert part.source == "trace" and part.devices and staging_is_empty(tmp_path)


def test_inline_export_categorises_from_the_trace(tmp_path: Path) -> None:
    part = memory_part(run(tmp_path, *MEMORY_FLAGS, "--torch-profile-export", "inline"))
    assert part.source == "trace" and staging_is_empty(tmp_path)


@pytest.mark.parametrize(("message", "shown"), [
    ("injected failure", "injected failure"),
    # PyTorch's memory profiler's own assertions, with its tensor-version tables (seen on FSDP2 and MoE)
    ("version mismatch: {id=125:     0x55 (100) (cpu): DataFlowEdge(input_version=0)}", "version mismatch"),
    ("duplicate outputs: MmBackward0 {id=94:     0x55ffd2721780 (100) (cpu): DataFlowEdge(input_version",
     "duplicate outputs: MmBackward0"),
], ids=["plain", "version-table", "named-table"])
def test_a_categorisation_that_fails_in_the_exporter_falls_back_to_the_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message: str, shown: str) -> None:
    def broken(result: object) -> None:
        raise AssertionError(message)

    monkeypatch.setattr(pytorch_profile, "memory_part", broken)  # the forked child inherits it
    prof = run(tmp_path, *MEMORY_FLAGS)
    part = memory_part(prof)
    assert part.source == "trace" and part.devices
    assert f"failed in the exporter (AssertionError: {shown})" in part.notes[0]
    assert "{id=" not in part.notes[0] and "DataFlowEdge" not in part.notes[0]
    assert prof.stats["traces_written"] == 1 and prof.stats["publish_failures"] == 0
    assert staging_is_empty(tmp_path)


def test_a_categorisation_over_its_time_is_cut_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(result: object) -> None:
        time.sleep(30)

    monkeypatch.setattr(pytorch_profile, "memory_part", slow)
    monkeypatch.setattr(exported, "EXPORT_SECONDS", 0.5)
    started = time.monotonic()
    part = memory_part(run(tmp_path, *MEMORY_FLAGS))
    assert time.monotonic() - started < 25
    assert part.source == "trace" and "stopped in the exporter after" in part.notes[0]
    assert "at most 0.5 s" in part.notes[0]
    assert staging_is_empty(tmp_path)


def test_a_trace_too_large_is_not_categorised_in_the_exporter(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exported, "MAX_TRACE_BYTES", 1000)
    part = memory_part(run(tmp_path, *MEMORY_FLAGS))
    assert part.source == "trace" and "was not run in the exporter" in part.notes[0]
