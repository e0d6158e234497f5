"""--torch-profile-flight-recorder and torchprof hang: real 2-rank gloo jobs that hang or get
SIGTERM, PyTorch's own flight recorder and analyzer (the dumps normalised for it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import REPO
from helpers.processes import free_port, rank_results, subprocess_env

from torchprof_args import TorchProfileArgsError, add_torch_profile_args
from torchprof_args.analysis.tools.hang import analyse_dumps, normalise_dumps
from torchprof_args.capture.config import configs_from_args
from torchprof_args.capture.ondemand.registry import STACKS_REGISTRY, registry_dir
from torchprof_args.capture.runtime import flight_recorder, flight_recorder_env
from torchprof_args.capture.runtime.config import FlightRecorderConfig
from torchprof_args.console import main as torchprof
from torchprof_args.torch_support import FEATURES, needs, torch_at_least

JOB = REPO / "tests" / "jobs" / "comm_job.py"
ENV_VARS = (*flight_recorder_env.BUFFER_VARS, *flight_recorder_env.DUMP_FILE_VARS,
            flight_recorder_env.DUMP_ON_TIMEOUT_VAR)


def test_flag_turns_the_recorder_on_at_parse_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(flight_recorder_env, "STATE", {"configured": False, "pg_existed": False})
    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args(["--torch-profile-dir", str(tmp_path / "run"),
                              "--torch-profile-flight-recorder", "32"])
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "32"  # set by the argparse action, before any process group
    assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    expected = tmp_path / "run" / "flight_recorder" / "nccl_trace_rank_"
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == str(expected)
    config = configs_from_args(args).profiler.flight_recorder
    assert (config.entries, config.output_dir) == (32, f"{tmp_path / 'run'}/flight_recorder")
    assert not configs_from_args(parser.parse_args([])).profiler.flight_recorder.enabled
    with pytest.raises(SystemExit):
        parser.parse_args(["--torch-profile-flight-recorder", "0"])


def test_the_stacks_server_flag_is_on_by_default_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(flight_recorder_env, "STATE", {"configured": False, "pg_existed": False})
    parser = add_torch_profile_args(argparse.ArgumentParser())
    run = ["--torch-profile-dir", str(tmp_path), "--torch-profile-on-demand"]
    on = configs_from_args(parser.parse_args(run)).profiler.flight_recorder
    assert on.stacks_server and not on.active and on.stacks_control_dir == f"{tmp_path}/stacks"
    assert not configs_from_args(parser.parse_args([*run, "--no-torch-profile-stacks-server"])
                                 ).profiler.flight_recorder.stacks_server
    stacks_only = configs_from_args(parser.parse_args([*run, "--torch-profile-stacks",
                                                       "--no-torch-profile-stacks-server"])).profiler.flight_recorder
    assert stacks_only.stacks and not stacks_only.stacks_server  # stacks at a hang, no server
    conflict = "--no-torch-profile-stacks-server with --torch-profile-flight-recorder: .* drop one of the two"
    with pytest.raises(TorchProfileArgsError, match=conflict):
        configs_from_args(parser.parse_args([*run, "--torch-profile-flight-recorder", "8",
                                             "--no-torch-profile-stacks-server"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--torch-profile-stacks-server=yes"])  # a switch: no value
    assert "ignored explicit argument 'yes'" in capsys.readouterr().err


def test_a_recorder_that_only_serves_dumps_nothing_and_stops_clean(tmp_path: Path) -> None:
    """The profiler on (``profiling``), neither the recorder nor the stacks: the stacks server alone."""
    config = FlightRecorderConfig(output_dir=str(tmp_path / "fr"),
                                  stacks_control_dir=str(tmp_path / "stacks"))
    assert flight_recorder.FlightRecorder.from_config(config, 0) is None  # the profiler off: nothing runs
    assert flight_recorder.FlightRecorder.from_config(dataclasses.replace(config, stacks_server=False), 0,
                                                      profiling=True) is None
    serving = flight_recorder.FlightRecorder.from_config(config, 0, profiling=True)
    assert serving is not None and not serving.dumps
    serving.arm()
    try:
        job = json.loads((tmp_path / "stacks" / "job.json").read_text())
        assert job["kind"] == "stacks" and job["state"] == "running"
        assert serving.dump("a failed fence barrier") == [] and serving.dumped is None
    finally:
        serving.disarm()
    assert json.loads((tmp_path / "stacks" / "job.json").read_text())["state"] == "stopped"
    assert not (tmp_path / "fr").exists()  # no dump folder, no dump_info
    stacks = flight_recorder.FlightRecorder.from_config(
        dataclasses.replace(config, stacks=True, stacks_server=False), 0, profiling=True)
    assert stacks is not None and stacks.dumps and stacks._server is None  # noqa: SLF001



@pytest.mark.slow
def test_the_end_of_the_sigterm_grace_waits_for_a_dump_in_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dump being written on another thread (the main thread, slow on a busy host) is waited for
    before the grace's emergency ends the process."""
    release = threading.Event()

    def slow_gloo_dump() -> bytes:
        release.wait(10)
        return b""

    monkeypatch.setattr(flight_recorder, "_dump_calls", lambda: {"gloo": slow_gloo_dump})
    (tmp_path / "fr").mkdir()
    recorder = flight_recorder.FlightRecorder(str(tmp_path / "fr"), entries=10, rank=0)
    assert recorder.wait_for_dump(0.0)  # nothing in progress
    writer = threading.Thread(target=recorder.dump, args=("a collective timed out",))
    writer.start()
    deadline = time.monotonic() + 10
    while recorder.dumped is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not recorder.wait_for_dump(0.2)  # in progress: waited, then given up
    threading.Timer(0.2, release.set).start()
    assert recorder.wait_for_dump(10)
    writer.join(10)
    info = json.loads((tmp_path / "fr" / "dump_info_rank0.json").read_text())
    assert info["reason"] == "a collective timed out"


@pytest.mark.slow
def test_profiler_warns_when_the_process_group_came_first(tmp_path: Path) -> None:
    """A real (1-rank gloo) process group created before the flags are parsed: PyTorch read no buffer size."""
    script = textwrap.dedent(f"""
        import argparse, torch.distributed as dist
        from torchprof_args import TorchProfiler, add_torch_profile_args
        dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
        args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(
            ["--torch-profile-flight-recorder", "16", "--torch-profile-dir", "{tmp_path / 'prof'}"])
        TorchProfiler.from_args(args)
        dist.destroy_process_group()
    """)
    env = subprocess_env()
    for name in ENV_VARS:
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the process group was created before the flag took effect" in done.stderr
    assert "export TORCH_FR_BUFFER_SIZE=16" in done.stderr


@pytest.mark.slow
def test_readme_example_rank_that_skips_an_all_reduce_is_named_by_torchprof_hang(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's example, verbatim: rank 1 leaves iteration 3 before its all-reduce and goes
    into the flush barrier; rank 0 waits in the all-reduce until the gloo timeout.  Every rank
    dumps (rank 0: the exception leaving the profiler; rank 1: the failed barrier, or the
    launcher's SIGTERM) and PyTorch's analyzer, on the normalised dumps, names rank 1."""
    prof = tmp_path / "prof"
    proc = run_doc_example("hang", tmp_path, timeout=300)
    context = proc.stdout[-4000:] + proc.stderr[-6000:]
    analyzer = torch_at_least(FEATURES["torchprof hang"][0])  # torch 2.9: the dumps, not the analyzer
    if analyzer:
        assert proc.returncode == 0, context
        assert "did not join" in proc.stdout, context
    else:  # no PyTorch analyzer: the stacks still say where each rank is, with a note why no more
        assert proc.returncode == 0, context
        assert "rank 1: comm_job.py:" in proc.stdout and needs("torchprof hang") in proc.stdout, context
    ended = rank_results(tmp_path)
    assert "Timed out" in ended[0]["error"], (ended, context)
    dumps = prof / "flight_recorder"
    assert sorted(p.name for p in dumps.iterdir()) == [  # with the stacks (--torch-profile-stacks is implied)
        "dump_info_rank0.json", "dump_info_rank1.json", "gloo_trace_rank_0", "gloo_trace_rank_1",
        "stacks_rank0.json", "stacks_rank1.json"], context
    pids = {int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)}
    registered = {int(p.stem) for p in registry_dir(STACKS_REGISTRY).glob("*.json")}
    assert not pids & registered, "a rank left its `torchprof trigger --pid` entry behind"
    infos = {r: json.loads((dumps / f"dump_info_rank{r}.json").read_text()) for r in (0, 1)}
    assert infos[0]["reason"].startswith("RuntimeError left the profiler's context"), (infos, context)
    reasons = ("the flush barrier at iteration 3 failed", "SIGTERM received")
    assert infos[1]["reason"].startswith(reasons), (infos, context)
    assert infos[0]["process_groups"]["0"] == {"desc": "default_pg", "ranks": [0, 1]}
    raw = pickle.loads((dumps / "gloo_trace_rank_0").read_bytes())
    # PyTorch's gloo dump has one process-group entry without a name: its members are "[]" before
    # torch 2.15, "[0, 1]" from 2.15 on; either way the normalised dumps name the groups and members
    assert [name for name in raw["pg_config"]] == [""], raw["pg_config"]
    assert raw["pg_config"][""]["ranks"] in ("[]", "[0, 1]"), raw["pg_config"]
    normalised, _ = normalise_dumps({0: raw}, infos)
    assert normalised[0]["pg_config"]["0"]["ranks"] == "[0, 1]", normalised[0]["pg_config"]

    if not analyzer:
        assert torchprof(["hang", str(prof)]) == 0
        assert f"were not analysed: {needs('torchprof hang')}" in capsys.readouterr().out
        return
    assert torchprof(["hang", str(prof)]) == 0
    text = capsys.readouterr().out
    answer = text.split("\n\n")[2].splitlines()  # after where each rank is (the stacks)
    assert len(answer) > 3, (text, context)
    # 4 collectives an iteration: the all-reduce of iteration 3 is the group's 10th
    assert answer[1] == ("process group 0 (default_pg): rank 1 did not join gloo:all_reduce #10 (input sizes "
                         "[[4096]]); rank 0 issued it and waits in it")
    # gloo marks a collective completed in its recorder lazily: #9 or #8 may show as the last completed
    assert answer[2].startswith("  rank 1: last collective it issued in the group: gloo:all_reduce #9 (input "
                                "sizes [[256]]); "), answer
    assert "comm_job.py" in answer[3] and "in main" in answer[3]
    assert "Not all ranks joining collective, sequence number: 10" in text  # PyTorch's analyzer, after ours
    assert text.index("did not join") < text.index("PyTorch's analyzer")

    # PyTorch's analyzer alone on the dumps as written: a process-group table it cannot read
    # (no group names), e.g. ('0', 0): process group and rank, in file order
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    args = JobConfig().parse_args([str(dumps), "--prefix", "gloo_trace_rank_"])
    details, version = read_dir(args)
    with pytest.raises(KeyError, match=r"\('[01]', [01]\)"):
        build_db(details, args, version)
    capsys.readouterr()

    # without the ranks' process-group tables, membership is inferred (and said); without rank 1's
    # dump, its absence is the answer
    bare = tmp_path / "bare"
    bare.mkdir()
    for rank in (0, 1):
        shutil.copy(dumps / f"gloo_trace_rank_{rank}", bare)
    (finding,) = analyse_dumps(bare)["recorders"][0]["findings"]
    assert finding["missing_ranks"] == [1] and finding["seq"] == 10
    assert any("members not recorded" in note for note in analyse_dumps(bare)["recorders"][0]["notes"])
    (bare / "gloo_trace_rank_1").unlink()
    shutil.copy(dumps / "dump_info_rank1.json", bare)  # rank 1 is known to be a member
    report = analyse_dumps(bare)["recorders"][0]
    assert report["missing_dumps"] == [1]
    assert torchprof(["hang", str(bare), "--brief"]) == 0
    assert "NO DUMP from ranks 1" in capsys.readouterr().out


@pytest.mark.slow
def test_sigterm_dumps_while_the_main_thread_is_blocked_in_a_collective(tmp_path: Path) -> None:
    """Flight recorder alone (no tracing): rank 0 waits in an all-reduce that rank 1 joins 8 s
    later; SIGTERM to rank 0 dumps within moments, mid-collective, then terminates it."""
    prof = tmp_path / "prof"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(JOB), "--result-dir", str(tmp_path), "--iters", "3",
               "--slow-rank", "1", "--slow-iteration", "2", "--slow-seconds", "8",
               "--torch-profile-dir", str(prof), "--torch-profile-flight-recorder", "64"]
    (tmp_path / "tmp").mkdir()  # TMPDIR: torchrun's torchelastic_* logs stay in the test's directory
    job = subprocess.Popen(command, env=subprocess_env(TMPDIR=str(tmp_path / "tmp")), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        pid_file = tmp_path / "rank0.pid"
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)  # rank 0 is now in the all-reduce rank 1 joins at ~8 s
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        output, _ = job.communicate(timeout=180)
    finally:
        job.kill()
    info = json.loads((prof / "flight_recorder" / "dump_info_rank0.json").read_text())
    assert info["reason"] == flight_recorder.SIGTERM_REASON
    dump = pickle.loads((prof / "flight_recorder" / "gloo_trace_rank_0").read_bytes())
    last = dump["entries"][-1]  # dumped while rank 0 was still in it (before rank 1 arrived): not retired
    assert (last["profiling_name"], last["input_sizes"], last["retired"]) == (
        "gloo:all_reduce", [[4096]], False)
    assert "exitcode  : -15" in output and "rank      : 0" in output  # then SIGTERM's default action
    assert not (tmp_path / "rank0.json").exists()


@pytest.mark.slow
def test_a_rank_still_dumping_when_the_launcher_stops_it_finishes_its_dump(tmp_path: Path) -> None:
    """bench_world's hang at 3 ranks: rank 2 skips an all-reduce; ranks 0 and 1 time out in it
    together and dump on the exception.  Rank 1's dump is slow (an oversubscribed host): rank 0
    finishes first and exits, torchrun sends SIGTERM to the others while rank 1 is still in its
    dump, which outlasts --torch-profile-term-grace (2 s).  Rank 1 finishes it before SIGTERM
    ends the process (it was cut short by the SIGTERM safe point in the handler, and at the end of
    the grace by the watchdog's emergency exit: that rank left no dump_info and no gloo dump)."""
    prof = tmp_path / "prof"
    (tmp_path / "tmp").mkdir()  # TMPDIR: torchrun's torchelastic_* logs stay in the test's directory
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(JOB), "--result-dir", str(tmp_path), "--iters", "5",
               "--skip-rank", "2", "--skip-iteration", "3", "--pg-timeout", "5",
               "--slow-dump-rank", "1", "--slow-dump-seconds", "8",
               "--torch-profile", "--torch-profile-ranks", "0", "--torch-profile-skip-first", "0",
               "--torch-profile-active", "2", "--torch-profile-term-grace", "2",
               "--torch-profile-dir", str(prof), "--torch-profile-flight-recorder", "64"]
    proc = subprocess.run(command, env=subprocess_env(TMPDIR=str(tmp_path / "tmp")), capture_output=True,
                          text=True, timeout=180)
    context = proc.stdout[-3000:] + proc.stderr[-8000:]
    dumps = prof / "flight_recorder"
    infos = {r: json.loads((dumps / f"dump_info_rank{r}.json").read_text())
             for r in range(3) if (dumps / f"dump_info_rank{r}.json").exists()}
    assert sorted(infos) == [0, 1, 2], context
    assert sorted(p.name for p in dumps.glob("gloo_trace_rank_*")) == [
        "gloo_trace_rank_0", "gloo_trace_rank_1", "gloo_trace_rank_2"], context
    assert infos[1]["reason"].startswith("RuntimeError left the profiler's context"), (infos[1], context)
    # the SIGTERM came while rank 1 was in its dump, the grace ended before the dump did: the
    # dump was waited for, then SIGTERM ended the rank
    pid = int((tmp_path / "rank1.pid").read_text())
    sent = proc.stderr.find(f"Sending process {pid} closing signal SIGTERM")
    grace = proc.stderr.find("[torchprof rank 1] rank 1: no safe point within --torch-profile-term-grace")
    waited = proc.stderr.find("[torchprof rank 1] rank 1: waiting for the flight-recorder dump in progress")
    dumped = proc.stderr.find("[torchprof rank 1] rank 1: flight recorder dumped to")
    assert -1 < sent < grace < waited < dumped, context
    # SIGTERM ended rank 1 (it wrote no result); torchrun's report of its exit code (-15) is not
    # checked: the launcher of torch 2.9 lists only the ranks that failed before it stopped the others
    assert not (tmp_path / "rank1.json").exists(), context
