"""--torch-profile-execution-trace in one process: PyTorch's execution trace of each recorded window,
published beside its Kineto trace (fork and inline export), partial windows, dropped windows,
untraced ranks, and an observer that fails without stopping training or the Kineto trace.
(The multi-rank case, a 2-stage DeepSpeed pipeline, is in test_deepspeed.py.)"""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from test_profiler import make_args, output_files, profiler_steps, train

from torchprof_args import TorchProfiler
from torchprof_args.atomic import PARTIAL_PREFIX
from torchprof_args.naming import EXECUTION_TRACE_SUFFIX, companion_path


def execution_trace_of(trace: str | Path) -> dict:
    trace = Path(trace)
    gz = trace.name.endswith(".gz")
    path = companion_path(trace, EXECUTION_TRACE_SUFFIX, gz)
    # In the cycle folder's execution_traces/: nothing but traces beside traces (HTA reads them all).
    assert path.parent == trace.parent / "execution_traces"
    with (gzip.open(path, "rt") if gz else open(path)) as handle:
        return json.load(handle)


def step_nodes(execution_trace: dict) -> list[int]:
    return sorted(int(n["name"].split("#")[1]) for n in execution_trace["nodes"]
                  if n["name"].startswith("ProfilerStep#"))


def staging_is_empty(logs) -> bool:
    """After stop() the rank's staging directories are gone, and nothing was left in them to remove."""
    bases = [Path("/dev/shm"), Path(os.environ.get("TMPDIR") or "/tmp")]
    gone = not any((base / f"torchprof-{os.getuid()}" / f"pid{os.getpid()}").exists() for base in bases)
    return gone and not [m for m in logs.at(logging.WARNING) if "staging leftovers" in m]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fork", "inline"])
def test_each_window_gets_its_execution_trace_beside_its_trace(tmp_path, mode, logs):
    args = make_args(tmp_path, "--torch-profile-active", "2", "--torch-profile-repeat", "2",
                     "--torch-profile-wait", "1", "--torch-profile-export", mode,
                     "--torch-profile-execution-trace")
    prof = TorchProfiler.from_args(args)
    train(prof, range(1, 13))
    assert [profiler_steps(t) for t in prof.published_traces] == [[4, 5], [8, 9]]
    for trace, steps in zip(prof.published_traces, ([4, 5], [8, 9]), strict=True):
        execution_trace = execution_trace_of(trace)
        assert "chakra" in execution_trace["schema"] and step_nodes(execution_trace) == steps
        # two steps of a 2-layer MLP: forward, backward and SGD, a few dozen operators each
        assert 20 < sum(n["name"].startswith("aten::") for n in execution_trace["nodes"]) < 2000
    assert len([n for n in output_files(tmp_path) if n.endswith(".et.json.gz")]) == 2
    assert not any(Path(name).name.startswith(PARTIAL_PREFIX) for name in output_files(tmp_path))
    assert staging_is_empty(logs)


def test_back_to_back_windows_and_uncompressed_output(tmp_path):
    """No wait and no warmup: a window starts right after the previous one is flushed."""
    args = make_args(tmp_path, "--torch-profile-wait", "0", "--torch-profile-warmup", "0",
                     "--torch-profile-active", "1", "--torch-profile-repeat", "3", "--no-torch-profile-gzip",
                     "--torch-profile-execution-trace", "--torch-profile-max-publishing", "0")
    prof = TorchProfiler.from_args(args)  # no bound on publishers: every window is recorded
    train(prof, range(1, 7))
    assert [profiler_steps(t) for t in prof.published_traces] == [[2], [3], [4]]
    assert [step_nodes(execution_trace_of(t)) for t in prof.published_traces] == [[2], [3], [4]]
    assert sorted(n for n in output_files(tmp_path) if n.endswith(".et.json")) == [
        f"{Path(t).parent.name}/execution_traces/{Path(t).name.replace('.pt.trace.json', '.et.json')}"
        for t in prof.published_traces]


def test_partial_window_is_kept_at_a_clean_exit_and_dropped_after_an_exception(tmp_path, logs):
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-active", "5",
                                             "--torch-profile-execution-trace"))
    train(prof, range(1, 6))  # records 3, 4, 5 of 3..7, then the loop ends
    (trace,) = prof.published_traces
    assert step_nodes(execution_trace_of(trace))[:3] == [3, 4, 5]

    dropped = TorchProfiler.from_args(make_args(tmp_path / "dropped", "--torch-profile-active", "5",
                                                "--torch-profile-execution-trace"))
    with pytest.raises(RuntimeError, match="training failed"):
        train(dropped, range(1, 10), fail_at=5)
    assert dropped.published_traces == [] and output_files(tmp_path / "dropped") == []
    assert staging_is_empty(logs)


def test_untraced_rank_records_no_execution_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-ranks", "0",
                                             "--torch-profile-execution-trace"))
    train(prof, range(1, 6))
    assert not prof.record and output_files(tmp_path) == []


def test_observer_failure_is_logged_and_the_kineto_trace_still_written(tmp_path, monkeypatch, logs):
    def refuse(self, path):  # noqa: ANN001, ANN202
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.ExecutionTraceObserver, "register_callback", refuse)
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-execution-trace"))
    train(prof, range(1, 5))
    assert [profiler_steps(t) for t in prof.published_traces] == [[3]]
    assert not [n for n in output_files(tmp_path) if ".et.json" in n]
    (error,) = [m for m in logs.at(40) if "execution trace" in m]
    assert "rank 0" in error and "No space left on device" in error and "Kineto trace goes on" in error
    assert staging_is_empty(logs)
