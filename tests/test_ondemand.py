"""On-demand tracing in one process: windows, answers, merging with the schedule, request
validation, control-directory permissions, the pid registry, ``torchprof trigger`` errors and the
KINETO_USE_DAEMON warning.  The multi-rank path is in test_ondemand_ranks.py."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO
from helpers.processes import subprocess_env
from test_profiler import profiler_steps, read_trace

from torchprof_args import TorchProfileArgsError, TorchProfiler, add_torch_profile_args, validate_args
from torchprof_args.capture.ondemand.client import RequestFailed, submit
from torchprof_args.capture.ondemand.protocol import (
    MAX_REQUEST_BYTES,
    RequestRejected,
    make_request,
    parse_request,
)
from torchprof_args.capture.ondemand.registry import find_control_dir_by_pid, registry_dir
from torchprof_args.private_dir import check_private_dir


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path, monkeypatch):
    """Keep this test's pid registry apart from real jobs of the same user."""
    monkeypatch.setenv("TORCHPROF_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def make_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    return parser.parse_args(["--torch-profile-on-demand", "--torch-profile-dir", str(tmp_path / "prof"),
                              "--no-torch-profile-operator-table", "--torch-profile-on-demand-interval", "5",
                              *argv])


def control_dir(tmp_path: Path) -> Path:
    return tmp_path / "prof" / "ondemand"


def run_steps(prof: TorchProfiler, iterations: range, before_step=None) -> None:
    """Train a tiny model; ``before_step(iteration)`` runs before ``prof.step`` (to drop requests)."""
    model = torch.nn.Linear(16, 16)
    with prof:
        for iteration in iterations:
            model(torch.randn(4, 16)).sum().backward()
            if before_step is not None:
                before_step(iteration)
            prof.step(iteration)


def answers(tmp_path: Path) -> dict[str, dict]:
    folder = control_dir(tmp_path) / "answers"
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


def write_request(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = control_dir(tmp_path) / "requests" / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def test_window_is_traced_answered_and_named_like_the_answer(tmp_path):
    prof = TorchProfiler.from_args(make_args(tmp_path))
    assert prof.enabled and not prof.record
    submitted = {}

    def drop_request(iteration: int) -> None:
        if iteration == 3:
            submitted["id"], _ = submit(control_dir(tmp_path), 3, [0])

    run_steps(prof, range(1, 16), drop_request)
    # Checked at 5, warmup 6, records 7..9, flushed at 9.
    (trace,) = prof.published_traces
    assert profiler_steps(trace) == [7, 8, 9]
    answer = answers(tmp_path)[submitted["id"]]
    assert answer["status"] == "accepted" and answer["check_iteration"] == 5
    assert answer["window"] == {"warmup_start": 6, "start": 7, "end": 10, "last": 9}
    assert answer["traces"] == {"0": trace}
    assert read_trace(trace)["torchprof_args"]["on_demand_request"] == submitted["id"]
    assert (control_dir(tmp_path) / "processed" / f"{submitted['id']}.json").exists()
    job = json.loads((control_dir(tmp_path) / "job.json").read_text())
    assert job["state"] == "stopped" and job["world_size"] == 1 and job["min_check_interval"] == 5
    assert not list(registry_dir().glob("*.json")), "the registry entry is removed at exit"


@pytest.mark.slow
def test_window_moves_past_a_scheduled_cycle(tmp_path, caplog):
    """Scheduled: warmup 3, record 4..5.  A request checked at 2 would overlap: it starts after 5."""
    args = make_args(tmp_path, "--torch-profile", "--torch-profile-skip-first", "2",
                     "--torch-profile-active", "2", "--torch-profile-on-demand-interval", "2")
    prof = TorchProfiler.from_args(args)
    run_steps(prof, range(1, 14), lambda i: i == 1 and submit(control_dir(tmp_path), 2, [0]))
    assert [profiler_steps(t) for t in prof.published_traces] == [[4, 5], [7, 8]]
    (answer,) = answers(tmp_path).values()
    assert answer["window"] == {"warmup_start": 6, "start": 7, "end": 9, "last": 8}
    assert "after the scheduled profiling" in answer["message"]


def test_partial_window_is_flushed_when_the_run_ends(tmp_path):
    prof = TorchProfiler.from_args(make_args(tmp_path))
    run_steps(prof, range(1, 9), lambda i: i == 1 and submit(control_dir(tmp_path), 5, [0]))
    (trace,) = prof.published_traces
    assert "/iter000007-000008/rank00000_" in trace and profiler_steps(trace)[:2] == [7, 8]


def test_malformed_and_foreign_requests_are_rejected_and_training_goes_on(tmp_path, caplog):
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-on-demand-max-iterations", "4"))
    valid = make_request(2, [0], request_id="zz-valid")

    def drop_requests(iteration: int) -> None:
        if iteration != 1:
            return
        write_request(tmp_path, "a-json.json", "{nope")
        write_request(tmp_path, "b-unknown.json", json.dumps({"iterations": 2, "command": "anything"}))
        write_request(tmp_path, "c-zero.json", json.dumps({"iterations": 0}))
        write_request(tmp_path, "d-many.json", json.dumps({"iterations": 5}))
        write_request(tmp_path, "e-ranks.json", json.dumps({"iterations": 1, "ranks": [0, 3]}))
        write_request(tmp_path, "f-big.json", b" " * (MAX_REQUEST_BYTES + 1) + b"{}")
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps({"iterations": 1}))
        os.symlink(target, control_dir(tmp_path) / "requests" / "g-link.json")
        (control_dir(tmp_path) / "requests" / "h-dir.json").mkdir()
        write_request(tmp_path, "bad name;.json", json.dumps({"iterations": 1}))
        write_request(tmp_path, "i-bool.json", json.dumps({"iterations": True}))
        foreign = write_request(tmp_path, "j-foreign.json", json.dumps({"iterations": 1}))
        if os.getuid() == 0:
            os.chown(foreign, 65534, 65534)
        write_request(tmp_path, "k-id.json", json.dumps({"iterations": 1, "id": "other"}))
        write_request(tmp_path, "zz-valid.json", json.dumps(valid))

    run_steps(prof, range(1, 40), drop_requests)
    got = answers(tmp_path)
    reasons = {name: answer.get("reason", "") for name, answer in got.items()}
    assert "not valid JSON" in reasons["a-json"]
    assert "unknown field(s) 'command'" in reasons["b-unknown"]
    assert "from 1 to 4" in reasons["c-zero"] and "from 1 to 4" in reasons["d-many"]
    assert "from 1 to 4" in reasons["i-bool"]
    assert "rank(s) 3 outside the world size 1" in reasons["e-ranks"]
    assert "larger than 4096 bytes" in reasons["f-big"]
    assert "symbolic link" in reasons["g-link"]
    assert "not a regular file" in reasons["h-dir"]
    assert "does not match the file name" in reasons["k-id"]
    if os.getuid() == 0:
        assert "owned by uid 65534" in reasons["j-foreign"]
    assert "bad name;" not in got, "no answer is written under an unsafe name"
    assert "invalid file name 'bad name;.json'" in caplog.text
    assert got["zz-valid"]["status"] == "accepted"
    # 13 entries, 8 per check: the valid one is taken at the second check (10), traced 12..13.
    (trace,) = prof.published_traces
    assert profiler_steps(trace) == [12, 13]
    assert os.listdir(control_dir(tmp_path) / "requests") == []
    assert "rejected: the request is not valid JSON" in caplog.text and "rank 0" in caplog.text


def test_requests_left_at_exit_are_answered(tmp_path):
    prof = TorchProfiler.from_args(make_args(tmp_path))
    ids = []
    run_steps(prof, range(1, 4), lambda i: i == 2 and ids.append(submit(control_dir(tmp_path), 1, [0])[0]))
    assert answers(tmp_path)[ids[0]] == {**answers(tmp_path)[ids[0]], "status": "rejected",
                                         "reason": "the job ended before the request was taken"}


def test_parse_request_bounds():
    ok = parse_request(json.dumps(make_request(3, "all", request_id="r1")).encode(), request_id="r1",
                       world_size=4, max_iterations=3)
    assert ok.iterations == 3 and ok.ranks is None
    assert parse_request(b'{"iterations": 1, "ranks": [3, 1, 3]}', request_id="r", world_size=4,
                         max_iterations=3).ranks == (1, 3)
    for payload, words in [
        (b"[]", "JSON object"),
        (b'{"iterations": 1, "ranks": []}', "non-empty list"),
        (b'{"iterations": 1, "ranks": [true]}', "non-empty list"),
        (b'{"iterations": 1, "version": 2}', "protocol version 2"),
        (b'{"iterations": 1, "requested_by": {"shell": "x"}}', "requested_by"),
        (b'{"iterations": 1.5}', "whole number"),
    ]:
        with pytest.raises(RequestRejected, match=words):
            parse_request(payload, request_id="r", world_size=4, max_iterations=3)


@pytest.mark.parametrize("problem", ["group-writable", "symlink", "foreign"])
def test_unsafe_control_dir_is_refused(tmp_path, problem):
    real = tmp_path / "control"
    real.mkdir(mode=0o700)
    given = real
    if problem == "group-writable":
        real.chmod(0o770)
        words = re.escape("group- or world-writable (mode 770)")
    elif problem == "symlink":
        given = tmp_path / "link"
        given.symlink_to(real)
        words = "symbolic link"
    else:
        if os.getuid() != 0:
            pytest.skip("needs root to give the directory to another user")
        os.chown(real, 65534, 65534)
        words = "owned by uid 65534, not by you"
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-on-demand-dir", str(given)))
    with pytest.raises(TorchProfileArgsError, match=words):
        prof.start()  # the collective set-up, before training
    assert check_private_dir(given) is not None
    (real / "requests").mkdir(exist_ok=True)
    with pytest.raises(RequestFailed, match=words):
        submit(given, 1, [0])


def test_control_dir_is_created_private(tmp_path):
    os.umask(0o022)
    with TorchProfiler.from_args(make_args(tmp_path)):
        pass
    for sub in ("", "requests", "processed", "answers"):
        assert (control_dir(tmp_path) / sub).stat().st_mode & 0o777 == 0o700


def test_on_demand_dir_flag_needs_on_demand(tmp_path):
    args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(
        ["--torch-profile-on-demand-dir", str(tmp_path)])
    with pytest.raises(TorchProfileArgsError,
                       match="--torch-profile-on-demand-dir needs --torch-profile-on-demand"):
        validate_args(args, world_size=1)


@pytest.mark.slow
def test_pid_registry_finds_a_rank_and_its_launcher(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import argparse, time
        from torchprof_args import TorchProfiler, add_torch_profile_args
        args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(
            ["--torch-profile-on-demand", "--torch-profile-dir", {str(tmp_path / 'prof')!r}])
        with TorchProfiler.from_args(args) as prof:
            print("ready", flush=True)
            time.sleep(60)
    """))
    env = subprocess_env(TORCHPROF_RUNTIME_DIR=os.environ["TORCHPROF_RUNTIME_DIR"])
    # A shell in between stands for torchrun/srun: the job is its child.
    launcher = subprocess.Popen(["bash", "-c", f"{sys.executable} {script}; true"], stdout=subprocess.PIPE,
                                text=True, env=env)
    rank_pid = None
    try:
        assert launcher.stdout.readline().strip() == "ready"
        (entry,) = registry_dir().glob("*.json")
        rank_pid = int(entry.stem)
        assert rank_pid != launcher.pid
        assert find_control_dir_by_pid(rank_pid) == control_dir(tmp_path)
        assert find_control_dir_by_pid(launcher.pid) == control_dir(tmp_path)
        listing = subprocess.run([sys.executable, "-m", "torchprof_args", "trigger", "--list"],
                                 capture_output=True, text=True, env=env)
        assert f"pid {rank_pid:>8}  rank     0  {control_dir(tmp_path)}" in listing.stdout
    finally:
        if rank_pid is not None:
            os.kill(rank_pid, signal.SIGTERM)  # the job leaves through TorchProfiler's SIGTERM handler
        else:
            launcher.kill()
        launcher.wait(timeout=30)
    assert list(registry_dir().glob("*.json")) == [], "unregistered on SIGTERM"
    with pytest.raises(LookupError,
                       match=f"--pid {os.getpid()}: no job started with --torch-profile-on-demand"):
        find_control_dir_by_pid(os.getpid())


def test_registry_dir_created_under_a_loose_umask_is_tightened(tmp_path):
    registry_dir().mkdir(parents=True, mode=0o775)
    registry_dir().chmod(0o775)
    prof = TorchProfiler.from_args(make_args(tmp_path))
    with prof:
        assert registry_dir().stat().st_mode & 0o777 == 0o755
        assert find_control_dir_by_pid(os.getpid()) == control_dir(tmp_path)


def test_several_ranks_without_a_process_group_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    prof = TorchProfiler.from_args(make_args(tmp_path))
    with pytest.raises(TorchProfileArgsError, match="needs torch.distributed initialised"):
        prof.start()


def test_stale_registry_entries_are_dropped(tmp_path):
    directory = registry_dir()
    directory.mkdir(parents=True, mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (directory / f"{dead.pid}.json").write_text(json.dumps({"pid": dead.pid, "control_dir": str(tmp_path)}))
    with pytest.raises(LookupError):
        find_control_dir_by_pid(dead.pid)
    assert not (directory / f"{dead.pid}.json").exists()


def trigger_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchprof_args", "trigger", *argv],
                          capture_output=True, text=True,
                          env=subprocess_env(TORCHPROF_RUNTIME_DIR=os.environ["TORCHPROF_RUNTIME_DIR"]))


@pytest.mark.slow
def test_trigger_errors_are_one_line(tmp_path):
    missing = trigger_cli("--job-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "no job.json there or in ondemand/" in missing.stderr
    prof = TorchProfiler.from_args(make_args(tmp_path, "--torch-profile-on-demand-max-iterations", "4"))
    with prof:
        too_many = trigger_cli("--job-dir", str(tmp_path / "prof"), "--iterations", "5")
        assert too_many.returncode == 2 and "more than the job allows (4" in too_many.stderr
        both = trigger_cli("--job-dir", str(tmp_path / "prof"), "--ranks", "all", "0")
        assert both.returncode == 2 and "either 'all' or rank numbers" in both.stderr
    nobody = trigger_cli("--pid", "999999999")
    assert nobody.returncode == 2 and "no job started with --torch-profile-on-demand" in nobody.stderr


@pytest.mark.slow
def test_unanswered_request_is_withdrawn_at_the_timeout(tmp_path):
    prof = TorchProfiler.from_args(make_args(tmp_path))
    prof.start()  # advertised, but never stepped: nobody takes the request
    started = time.monotonic()
    result = trigger_cli("--job-dir", str(tmp_path / "prof"), "--timeout", "1")
    assert result.returncode == 1 and "no answer within --timeout; the request was withdrawn" in result.stderr
    assert time.monotonic() - started < 30
    assert os.listdir(control_dir(tmp_path) / "requests") == []
    prof.stop()
    stopped = trigger_cli("--job-dir", str(tmp_path / "prof"))
    assert stopped.returncode == 1 and "has stopped" in stopped.stderr


KINETO_SCRIPT = """
import argparse, os, sys
{before}
import torch
{after}
from torchprof_args import TorchProfiler, add_torch_profile_args
args = add_torch_profile_args(argparse.ArgumentParser()).parse_args([])
TorchProfiler.from_args(args)
TorchProfiler.from_args(args)
sys.stderr.flush()
os._exit(0)  # skip Kineto's daemon shutdown (it waits for a dynolog that is not running here)
"""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["late", "early", "wrapper"])
def test_kineto_use_daemon_set_after_torch_import_is_warned_once(when):
    set_it = "os.environ['KINETO_USE_DAEMON'] = '1'"
    code = KINETO_SCRIPT.format(before=set_it if when == "early" else "",
                                after=set_it if when == "late" else "")
    command = [sys.executable, "-c", code]
    if when == "wrapper":  # the documented way: the launcher wrapper sets it before Python starts
        command = ["bash", str(REPO / "integrations" / "dynolog" / "run_with_dynolog_env.sh"), *command]
    env = subprocess_env()
    env.pop("KINETO_USE_DAEMON", None)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines()
                if "KINETO_USE_DAEMON is set, but only after" in line]
    if when == "late":
        assert len(warnings) == 1 and "[torchprof rank 0]" in warnings[0] and "rank 0:" in warnings[0]
    else:
        assert warnings == []
    if when == "wrapper":  # torch saw it: Kineto registered its daemon config loader
        assert "Registering daemon config loader" in result.stderr


def test_decision_encoding_round_trips():
    """A check's decision travels as one fixed-size asynchronous broadcast."""
    from torchprof_args.capture.ondemand.window import OnDemandWindow
    from torchprof_args.capture.ondemand.wire import decode_decision as _decode_decision
    from torchprof_args.capture.ondemand.wire import encode_decision as _encode_decision

    for window, world in [(OnDemandWindow("req-1.x", 100, 101, 102, 105, (0, 3)), 4),
                          (OnDemandWindow("a" * 100, 5, 6, 7, 8, None), 2), (None, 3)]:
        assert _decode_decision(_encode_decision(window, 1234, world), world) == (window, 1234)


def test_checks_are_paced_by_time_not_iterations():
    """Rank 0 spaces checks --torch-profile-on-demand-check-seconds apart from the measured step time."""
    from torchprof_args.capture.ondemand.config import OnDemandConfig
    from torchprof_args.capture.ondemand.controller import OnDemandController

    config = OnDemandConfig(enabled=True, control_dir="/nonexistent", trace_dir="/tmp", interval=10,
                            check_seconds=0.05)
    controller = OnDemandController(config, rank=0, world_size=1)
    assert controller.start_checks(100) == 110
    controller.poll(110, group=None)  # first check: no step time known yet -> the minimum interval
    assert controller.next_check == 120
    time.sleep(0.05)  # 10 iterations took ~50 ms: 5 ms per iteration -> ~10 iterations per 50 ms
    controller.poll(120, group=None)
    assert controller.next_check == 130
    controller.poll(1120, group=None)  # 1000 iterations in no time: fast steps -> checks far apart
    assert controller.next_check > 1120 + 1000
