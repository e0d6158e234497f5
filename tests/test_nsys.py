"""``torchprof nsys`` command lines and the NsysController (CPU: one message, no crash)."""

from __future__ import annotations

import argparse
import logging
import shlex

import pytest
from helpers.cuda import cpu_only

from torchprof_args import add_torch_profile_args, configs_from_args, console
from torchprof_args.capture.runtime.nsys import NsysController
from torchprof_args.commands.nsys import nsys_command


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("SLURM_NODEID", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_printed_command(clean_env, capsys) -> None:
    argv = ["nsys", "--", "torchrun", "--nproc-per-node", "8", "train.py", "--torch-profile-nsys"]
    assert console.main(argv) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert printed[:2] == ["nsys", "profile"]
    assert printed[printed.index("-t") + 1] == "cuda,nvtx,osrt"
    assert "--capture-range=cudaProfilerApi" in printed
    assert "--capture-range-end=stop" in printed
    assert "--cuda-memory-usage=true" in printed
    assert printed[printed.index("-o") + 1] == "prof/nsys/nsys_%h_%p"
    assert printed[printed.index("torchrun"):] == argv[2:]


def test_printed_command_per_slurm_node_with_mpi_and_extras(clean_env, capsys) -> None:
    clean_env.setenv("SLURM_NODEID", "4")
    assert console.main(["nsys", "--mpi", "--output-dir", "/scratch/n", "--capture-range-end", "repeat:2",
                         "--extra=--gpu-metrics-devices=all", "--extra", "--sample none",
                         "--", "python", "train.py"]) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert printed[printed.index("-t") + 1] == "cuda,nvtx,osrt,mpi"
    assert printed[printed.index("-o") + 1] == "/scratch/n/nsys_%h_node%q{SLURM_NODEID}_%p"
    assert "--capture-range-end=repeat:2" in printed
    assert printed[-5:] == ["--gpu-metrics-devices=all", "--sample", "none", "python", "train.py"]


def test_run_mode_uses_this_machines_names() -> None:
    argv = nsys_command(["python", "t.py"], "out", placeholders=False, env={"NODE_RANK": "1"},
                        host="gpu3.cluster", nsys="/opt/nsys")
    assert argv[0] == "/opt/nsys" and argv[argv.index("-o") + 1] == "out/nsys_gpu3_node1_%p"


def test_command_required(capsys) -> None:
    assert console.main(["nsys"]) == 2
    assert "after `--`" in capsys.readouterr().err


def test_run_without_nsys_says_so(clean_env, tmp_path, capsys) -> None:
    clean_env.setenv("PATH", str(tmp_path))
    assert console.main(["nsys", "--run", "--output-dir", str(tmp_path / "o"), "--", "python", "t.py"]) == 127
    assert "--run needs Nsight Systems' `nsys`" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _args(*argv: str) -> argparse.Namespace:
    return add_torch_profile_args(argparse.ArgumentParser()).parse_args(list(argv))


@cpu_only
def test_controller_on_cpu_says_once_and_does_nothing(logs) -> None:
    nsys = NsysController(enabled=configs_from_args(_args("--torch-profile-nsys")).profiler.nsys.enabled)
    for iteration in range(6):
        nsys.on_step(iteration, recording=iteration in (2, 3))
        with nsys.range("forward"):
            pass
    nsys.close()
    nsys.close()
    messages = [r.getMessage() for r in logs.records]
    assert len(messages) == 1 and logs.records[0].levelno == logging.WARNING
    assert "--torch-profile-nsys needs CUDA" in messages[0] and "rank 0" in messages[0]
    assert not nsys.capturing


def test_controller_disabled_is_silent(logs) -> None:
    nsys = NsysController(enabled=configs_from_args(_args()).profiler.nsys.enabled)
    nsys.on_step(0, True)
    with nsys.range("x"):
        pass
    nsys.close()
    assert not logs.records


class CallLog:
    """Backend that only logs calls: CUDA's profiler API does not exist on this machine."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def synchronize(self) -> None:
        self.calls.append("sync")

    def profiler_start(self) -> None:
        self.calls.append("start")

    def profiler_stop(self) -> None:
        self.calls.append("stop")

    def range_push(self, name: str) -> None:
        self.calls.append(f"push {name}")

    def range_pop(self) -> None:
        self.calls.append("pop")


def test_capture_range_covers_exactly_the_recorded_steps() -> None:
    backend = CallLog()
    nsys = NsysController(backend=backend, cuda_available=True)
    for iteration, recording in [(1, False), (2, True), (3, True), (4, False), (5, True)]:
        nsys.on_step(iteration, recording)
        with nsys.range("timer"):
            pass
    nsys.close()
    assert backend.calls == [
        "push step 1", "push timer", "pop",
        "pop", "sync", "start", "push step 2", "push timer", "pop",
        "pop", "push step 3", "push timer", "pop",
        "pop", "sync", "stop", "push step 4", "push timer", "pop",
        "pop", "sync", "start", "push step 5", "push timer", "pop",
        "pop", "sync", "stop",
    ]
    assert not nsys.capturing
