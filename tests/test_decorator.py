"""The ``torchprof_args.cli`` decorator: flags, profiler_list.dat, TensorBoard output, errors,
bare use on a plain argparse program, and resume numbering.  Runs the README's example verbatim."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
import torch
from helpers.examples import run_doc_example
from helpers.paths import REPO
from helpers.processes import subprocess_env

import torchprof_args


@pytest.mark.slow
def test_readme_example_writes_traces_profiler_list_and_tensorboard(tmp_path):
    proc = run_doc_example("cli", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    prof = tmp_path / "prof_other"
    (trace,) = prof.glob("*/*.pt.trace.json.gz")
    assert trace.parent.name == "iter000003-000004"
    listing = (prof / "profiler_list.dat").read_text()
    assert f"iter000003-000004/{trace.name}" in listing and "ProfilerStep#3" in listing
    assert "accelerator.train_step" in listing and "aten::addmm" in listing
    # One TensorBoard session per profiled cycle.
    assert (prof / "tensorboard" / "plugins" / "profile" / "iter000003-000004" / trace.name).exists()
    assert list((prof / "tensorboard" / "rank00000").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_invalid_flags_exit_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "integrations" / "cli" / "train.py"), "--profiling",
                           "--torch-profile-step-end", "3"], cwd=tmp_path, capture_output=True, text=True,
                          env=subprocess_env())
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "train.py: error: --torch-profile-step-end needs --torch-profile-step-start."]


@pytest.mark.slow
def test_bare_decorator_on_a_plain_function_with_resume_and_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen = {}

    @torchprof_args.cli
    def main(args: argparse.Namespace, profiling) -> int:  # noqa: ANN001
        model = torch.nn.Linear(16, 16)
        profiling.start(start_iteration=100)  # resumed after 100 optimizer steps
        for step in range(101, 105):
            with profiling.train_step():
                model(torch.randn(4, 16)).sum().backward()
            with profiling.region("my.eval"):
                model(torch.randn(2, 16))
            profiling.step(step)
        seen["args"] = args
        return 7

    assert main(["--profiling", "--torch-profile-step-start", "103", "--torch-profile-profile-memory"]) == 7
    assert seen["args"].torch_profile_dir == "./prof" and seen["args"].torch_profile
    (trace,) = (tmp_path / "prof").glob("*/*.pt.trace.json.gz")
    assert trace.parent.name == "iter000103-000103"
    listing = (tmp_path / "prof" / "profiler_list.dat").read_text()
    assert "my.eval" in listing and "emory" in listing  # memory overview at the end


def test_disabled_profiling_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    @torchprof_args.cli(argparse.ArgumentParser(prog="plain"))
    def main(args: argparse.Namespace, profiling) -> None:  # noqa: ANN001
        for step in range(1, 4):
            with profiling.train_step():
                torch.ones(2).sum()
            profiling.step(step)

    main([])
    assert not os.path.exists(tmp_path / "prof") or not os.listdir(tmp_path / "prof")


def test_conflicting_directories_are_refused(tmp_path, capsys):
    @torchprof_args.cli
    def main(args: argparse.Namespace, profiling) -> None:  # noqa: ANN001
        raise AssertionError("not reached")

    with pytest.raises(SystemExit) as exit_info:
        main(["--profiling", "--prof_dir", str(tmp_path / "a"), "--torch-profile-dir", str(tmp_path / "b")])
    assert exit_info.value.code == 2
    assert "--prof_dir and --torch-profile-dir" in capsys.readouterr().err


@pytest.mark.slow
def test_decorator_with_deepspeed_writes_profiler_ds(tmp_path):
    from helpers.processes import run_torchrun

    proc = run_torchrun(REPO / "tests" / "jobs" / "cli_deepspeed_job.py", "--profiling", "--prof_dir",
                        str(tmp_path / "prof"), "--torch-profile-skip-first", "2", nproc=1, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    prof = tmp_path / "prof"
    (trace,) = prof.glob("*/*.pt.trace.json.gz")
    assert trace.parent.name == "iter000004-000004"  # optimizer steps: skip 2, warmup 1, record step 4
    assert "DeepSpeed Flops Profiler" in (prof / "profiler_ds.txt").read_text()
    assert "ProfilerStep#4" in (prof / "profiler_list.dat").read_text()
