"""Every rank's stacks beside the flight recorder (--torch-profile-stacks), `torchprof trigger
--stacks` and `torchprof hang` merging both: real threads, a real stacks server, real 4-rank gloo
jobs with one rank stuck in a Python loop or blocked in a C call."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import REPO
from helpers.processes import rank_results, start_torchrun, subprocess_env

from torchprof_args.analysis.analyzers.where import where_ranks_are
from torchprof_args.analysis.tools.hang import analyse_dumps
from torchprof_args.capture.ondemand.protocol import RequestRejected, parse_stacks_request
from torchprof_args.capture.ondemand.registry import STACKS_REGISTRY, registry_dir
from torchprof_args.capture.stacks.dumper import StackDumper, collect_threads
from torchprof_args.capture.stacks.server import StacksServer
from torchprof_args.commands.trigger_stacks import request_stacks
from torchprof_args.console import main as torchprof
from torchprof_args.errors import TraceError
from torchprof_args.shared.stacks_file import load_stacks, main_frames

JOB = REPO / "tests" / "jobs" / "stacks_job.py"
NPROC = 4


def _blocked_thread() -> tuple[threading.Thread, int]:
    """A real thread blocked in ``os.read`` on a pipe nobody writes; returns it and the write end."""
    read_end, write_end = os.pipe()
    thread = threading.Thread(target=os.read, args=(read_end, 1), name="blocked-reader", daemon=True)
    thread.start()
    return thread, write_end


def test_threads_main_first_with_a_thread_blocked_in_c() -> None:
    thread, write_end = _blocked_thread()
    try:
        threads = collect_threads()
    finally:
        os.write(write_end, b"x")
        thread.join()
    assert threads[0]["main"] and threads[0]["name"] == "MainThread"
    assert threads[0]["frames"][0]["function"] == "collect_threads"  # innermost first
    blocked = next(t for t in threads if t["name"] == "blocked-reader")
    assert blocked["frames"][0]["function"] == "run"  # os.read is C: the thread's last Python frame


def test_dump_is_private_atomic_and_keeps_the_exception(tmp_path: Path) -> None:
    dumper = StackDumper(tmp_path / "fr", rank=3, native=False)
    try:
        raise RuntimeError("collective timed out")
    except RuntimeError as err:
        path = dumper.dump("a test", exc=err)
    assert path == tmp_path / "fr" / "stacks_rank3.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["stacks_rank3.json"]  # no partial file left
    record = load_stacks(path)
    frames, source = main_frames(record)
    assert source == "raised"
    assert frames[0]["function"] == "test_dump_is_private_atomic_and_keeps_the_exception"
    assert frames[0]["code"] == 'raise RuntimeError("collective timed out")'
    assert record["rank"] == 3 and record["native"]["status"] == "not asked"


def test_bad_stacks_requests_are_rejected_with_the_reason() -> None:
    good = json.dumps({"version": 1, "id": "r1", "kind": "stacks", "native": True}).encode()
    assert parse_stacks_request(good, "r1").native
    cases = {b"[": "not valid JSON", b'{"kind": "stacks", "rm": 1}': "unknown field",
             b'{"kind": "trace"}': "kind must be 'stacks'",
             b'{"kind": "stacks", "native": 1}': "native must be",
             b'{"kind": "stacks", "id": "other"}': "does not match the file name",
             b'{"kind": "stacks", "version": 9}': "protocol version 9"}
    for data, reason in cases.items():
        with pytest.raises(RequestRejected, match=reason):
            parse_stacks_request(data, "r1")
    with pytest.raises(RequestRejected, match="not a valid request id"):
        parse_stacks_request(good, "../r1")


@pytest.mark.slow  # the server looks once a second
def test_server_answers_while_a_thread_is_blocked_and_rejects_a_symlink(tmp_path: Path) -> None:
    """A real server thread: one stat a second, every request answered by this rank itself."""
    control = tmp_path / "prof" / "stacks"
    server = StacksServer(control, StackDumper(tmp_path / "fr", rank=0, native=False), rank=0, world_size=1)
    assert server.start()
    thread, write_end = _blocked_thread()
    try:
        outcome = request_stacks(control, native=False, timeout=10)
        (control / "requests" / "evil.json").symlink_to(tmp_path / "elsewhere.json")
        deadline = time.monotonic() + 10
        while not (control / "answers" / "evil" / "rejected_rank0.json").exists():
            assert time.monotonic() < deadline, "the symlinked request was never rejected"
            time.sleep(0.05)
    finally:
        os.write(write_end, b"x")
        thread.join()
        server.stop()
    assert outcome["answered"] == [0] and outcome["missing"] == [], outcome
    assert not list((control / "requests").glob(f"{outcome['request']}*"))  # withdrawn after the answers
    record = load_stacks(Path(outcome["directory"]) / "stacks_rank0.json")
    assert "blocked-reader" in [t["name"] for t in record["threads"]]
    assert record["request"] == outcome["request"]
    rejected = json.loads((control / "answers" / "evil" / "rejected_rank0.json").read_text())
    assert "symbolic link" in rejected["reason"]
    assert json.loads((control / "job.json").read_text())["state"] == "stopped"


def test_groups_put_the_odd_rank_first_and_need_no_flight_recorder(tmp_path: Path) -> None:
    """Three real records at one place, one elsewhere: the odd one is listed first."""
    def record(rank: int, spin: bool) -> dict:
        dumper = StackDumper(tmp_path, rank=rank, native=False)
        return dumper.record("test") if not spin else _record_in_a_loop(dumper)

    stacks = {rank: record(rank, rank == 2) for rank in range(4)}
    answer = where_ranks_are(stacks, world_size=5)
    assert [g["ranks"] for g in answer["groups"]] == [[2], [0, 1, 3]]
    assert answer["groups"][0]["where"].endswith("in _record_in_a_loop")
    assert answer["missing"] == [4]


def _record_in_a_loop(dumper: StackDumper) -> dict:
    return dumper.record("test")


def test_hang_on_a_folder_without_dumps_or_stacks_says_what_to_run(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TraceError, match="--torch-profile-stacks"):
        analyse_dumps(tmp_path)
    assert torchprof(["hang", str(tmp_path)]) == 2
    said = capsys.readouterr().err
    assert ("run with --torch-profile-flight-recorder N, --torch-profile-stacks or "
            "--torch-profile-debug-server") in said


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, (path, (path.parents[2] / "torchrun.err").read_text()[-3000:])
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _torchprof(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``torchprof`` command of this checkout, in its own process (as a user runs it)."""
    return subprocess.run([sys.executable, "-m", "torchprof_args", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=subprocess_env())


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher (it stops every rank), then make sure nothing is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_a_rank_spinning_in_python_is_named_with_its_line(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Proof (a), the hang guide's example verbatim: rank 2 spins before iteration 2's all-reduce;
    ranks 0, 1, 3 time out in it (gloo, 5 s) and dump; the launcher's SIGTERM makes rank 2 dump."""
    proc = run_doc_example("hang-stacks", tmp_path, timeout=300)
    context = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, context
    where = proc.stdout.split("\n\n")[1].splitlines()
    assert where[1].startswith("  rank 2: stacks_job.py:3"), context
    assert "in spin_before_all_reduce" in where[1], context
    assert where[1].endswith("; never issued gloo:all_reduce #2"), context
    heads = [line for line in where if line.startswith("  rank")]  # one line per group, then its frames
    assert heads[1].startswith("  ranks 0, 1, 3: distributed_c10d.py:"), context
    assert "called from stacks_job.py:" in heads[1] and heads[1].endswith("waits in gloo:all_reduce #2")
    folder = tmp_path / "prof" / "flight_recorder"
    for rank in range(NPROC):
        assert stat.S_IMODE((folder / f"stacks_rank{rank}.json").stat().st_mode) == 0o600
    assert torchprof(["hang", str(tmp_path / "prof"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["where"]["groups"][0]["ranks"] == [2]
    assert report["where"]["ranks"]["2"]["never_issued"] == "gloo:all_reduce #2"


@pytest.mark.slow
def test_without_the_flight_recorder_stacks_still_answer(tmp_path: Path) -> None:
    """Proof (d): --torch-profile-stacks alone; `torchprof hang` names rank 2 and its line."""
    proc = run_doc_example("hang-stacks-only", tmp_path, timeout=300)
    context = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, context
    folder = tmp_path / "prof" / "flight_recorder"
    assert not list(folder.glob("gloo_trace_rank_*")), context
    expected = [f"stacks_rank{r}.json" for r in range(NPROC)]
    assert sorted(p.name for p in folder.glob("stacks_rank*.json")) == expected
    where = proc.stdout.split("\n\n")[1].splitlines()
    assert where[1].startswith("  rank 2: stacks_job.py:3"), context
    assert "in spin_before_all_reduce" in where[1], context
    heads = [line for line in where if line.startswith("  rank")]
    assert heads[1].startswith("  ranks 0, 1, 3: distributed_c10d.py:"), context
    assert "flight recorder" not in proc.stdout.split("\n\n", 2)[2], context


@pytest.mark.slow
def test_a_rank_blocked_in_a_c_call_answers_trigger_stacks(tmp_path: Path) -> None:
    """Proof (b): rank 1 blocks in os.read on a pipe nobody writes, the others wait in the all-reduce
    (long gloo timeout): `trigger --stacks --native` gets every rank's stack from the server
    threads; rank 1's shows the read.  The test's SIGTERM ends the job; every rank dumps."""
    proc = start_torchrun(JOB, "--result-dir", str(tmp_path), "--pipe-rank", "1", "--pg-timeout", "300",
                          "--torch-profile-dir", "prof", "--torch-profile-flight-recorder", "64",
                          nproc=NPROC, cwd=tmp_path)
    try:
        _wait_for(tmp_path / "prof" / "stacks" / "job.json", proc)
        for rank in range(NPROC):
            _wait_for(tmp_path / f"rank{rank}.pid", proc)
        time.sleep(3)  # every rank reaches iteration 2
        done = _torchprof(tmp_path, "trigger", "--stacks", "--native", "--job-dir", "prof", "--json")
    finally:
        _end(proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["answered"] == [0, 1, 2, 3]
    assert [g["ranks"] for g in answer["where"]["groups"]] == [[1], [0, 2, 3]]
    rank1 = answer["where"]["ranks"]["1"]
    assert rank1["where"].startswith("stacks_job.py:")
    assert rank1["where"].endswith("in read_from_pipe_nobody_writes")
    assert rank1["code"] == "return os.read(read_end, 1)"
    if rank1["native"] == "ok":  # py-spy may attach here: the C frame of the read itself
        assert "read" in rank1["native_text"]
    hang = _torchprof(tmp_path, "hang", "prof", "--brief")
    assert "rank 1: stacks_job.py:" in hang.stdout.split("\n\n")[1], hang.stdout + hang.stderr
    assert proc.returncode != 0 and not list(tmp_path.rglob(".partial-*"))
    pids = {int((tmp_path / f"rank{rank}.pid").read_text()) for rank in range(NPROC)}
    registered = {int(p.stem) for p in registry_dir(STACKS_REGISTRY).glob("*.json")}
    assert not pids & registered, "a rank ended by SIGTERM left its `trigger --pid` entry"


@pytest.mark.slow
def test_on_demand_guides_trigger_stacks_example(tmp_path: Path) -> None:
    """The on-demand guide's example verbatim: rank 1 blocked in a C call answers from its server
    thread, and is the odd group, first; the launcher's SIGTERM then ends every rank."""
    proc = run_doc_example("trigger-stacks", tmp_path, timeout=300)
    context = proc.stdout[-4000:] + proc.stderr[-4000:] + (tmp_path / "job.log").read_text()[-3000:]
    assert proc.returncode == 0, context
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("stacks of 4 of 4 ranks in ") and "prof/stacks/answers/" in lines[0], context
    assert lines[1].startswith("rank 1: stacks_job.py:"), context
    assert lines[1].endswith("in read_from_pipe_nobody_writes"), context
    assert lines[2] == "      > return os.read(read_end, 1)", context
    pids = {int((tmp_path / f"rank{rank}.pid").read_text()) for rank in range(NPROC)}
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in pids):  # the SIGTERM ended them
        assert time.monotonic() < deadline, "ranks still running after the launcher's SIGTERM"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_trigger_stacks_on_a_healthy_job_leaves_it_running(tmp_path: Path) -> None:
    """Proof (c): every rank answers, the job finishes every step (step times: benchmarks/bench_stacks.py)."""
    proc = start_torchrun(JOB, "--result-dir", str(tmp_path), "--iters", "150", "--step-sleep", "0.05",
                          "--torch-profile-dir", "prof", "--torch-profile-stacks", nproc=NPROC, cwd=tmp_path)
    try:
        _wait_for(tmp_path / "prof" / "stacks" / "job.json", proc)
        outcomes = [request_stacks(tmp_path / "prof" / "stacks", native=False, timeout=30) for _ in range(2)]
        by_pid = _torchprof(tmp_path, "trigger", "--stacks", "--pid", str(proc.pid))  # the launcher's pid
        proc.wait(timeout=240)
    finally:
        _end(proc)
    assert proc.returncode == 0, (tmp_path / "torchrun.err").read_text()[-3000:]
    assert by_pid.returncode == 0, by_pid.stdout + by_pid.stderr
    assert by_pid.stdout.startswith("stacks of 4 of 4 ranks in "), by_pid.stdout
    assert by_pid.stdout.splitlines()[1].startswith("rank"), by_pid.stdout  # the first group: where it is
    for outcome in outcomes:
        assert outcome["answered"] == [0, 1, 2, 3] and not outcome["rejected"], outcome
        for rank in range(NPROC):
            record = load_stacks(Path(outcome["directory"]) / f"stacks_rank{rank}.json")
            assert any("stacks_job.py" in f["file"] for f in main_frames(record)[0]), record["threads"][0]
    ended = rank_results(tmp_path)
    assert all(ended[r]["ended"] == "done" and len(ended[r]["step_seconds"]) == 150 for r in range(NPROC))
    assert json.loads((tmp_path / "prof" / "stacks" / "job.json").read_text())["state"] == "stopped"



@pytest.mark.slow
def test_a_job_with_only_on_demand_answers_trigger_stacks(tmp_path: Path) -> None:
    """The stacks server runs wherever the profiler runs: a 2-rank job started for on-demand traces
    only, rank 1 blocked in a C call, answers `torchprof trigger --stacks` (no restart, no flag)."""
    proc = start_torchrun(JOB, "--result-dir", str(tmp_path), "--pipe-rank", "1", "--pg-timeout", "300",
                          "--torch-profile-dir", "prof", "--torch-profile-on-demand", nproc=2, cwd=tmp_path)
    try:
        _wait_for(tmp_path / "stuck1", proc)
        done = _torchprof(tmp_path, "trigger", "--stacks", "--job-dir", "prof", "--json")
        by_pid = _torchprof(tmp_path, "trigger", "--stacks", "--pid", str(proc.pid))  # the launcher's pid
    finally:
        _end(proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["answered"] == [0, 1]  # two groups of one: no odd one to put first
    assert sorted(g["ranks"] for g in answer["where"]["groups"]) == [[0], [1]]
    assert answer["where"]["ranks"]["1"]["where"].endswith("in read_from_pipe_nobody_writes")
    assert by_pid.returncode == 0 and by_pid.stdout.startswith("stacks of 2 of 2 ranks in "), by_pid.stderr
    assert not (tmp_path / "prof" / "flight_recorder").exists()  # it serves; it dumps nothing at the end


@pytest.mark.slow
def test_a_job_without_the_stacks_server_says_so_naming_the_flag(tmp_path: Path) -> None:
    """--no-torch-profile-stacks-server: no thread, no control directory; a trigger says there is no
    stacks server and names the flag (exit 2), and the job trains on to its end."""
    proc = start_torchrun(JOB, "--result-dir", str(tmp_path), "--iters", "60", "--step-sleep", "0.1",
                          "--torch-profile-dir", "prof", "--torch-profile-on-demand",
                          "--no-torch-profile-stacks-server", nproc=2, cwd=tmp_path)
    try:
        _wait_for(tmp_path / "prof" / "ondemand" / "job.json", proc)  # the job has entered the profiler
        by_dir = _torchprof(tmp_path, "trigger", "--stacks", "--job-dir", "prof")
        by_pid = _torchprof(tmp_path, "trigger", "--stacks", "--pid", str(proc.pid))
        proc.wait(timeout=240)
    finally:
        _end(proc)
    for outcome in (by_dir, by_pid):
        assert outcome.returncode == 2 and outcome.stderr.count("\n") == 1, outcome.stderr
        assert outcome.stderr.startswith("torchprof trigger: error: --")
        assert "--no-torch-profile-stacks-server" in outcome.stderr and "Traceback" not in outcome.stderr
    assert "no stacks server" in by_dir.stderr
    assert proc.returncode == 0, (tmp_path / "torchrun.err").read_text()[-3000:]
    assert not (tmp_path / "prof" / "stacks").exists()
    assert all(r["ended"] == "done" for r in rank_results(tmp_path).values())


def test_trigger_stacks_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert torchprof(["trigger", "--native", "--job-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "torchprof trigger: error: --native needs --stacks\n"
    assert torchprof(["trigger", "--stacks", "--job-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchprof trigger: error: --job-dir ")
    assert "no stacks server" in err and "--no-torch-profile-stacks-server" in err
    assert err.count("\n") == 1


def test_native_frames_unavailable_is_said_once(monkeypatch: pytest.MonkeyPatch, logs) -> None:
    """Where py-spy is missing (or may not attach) the stacks say why, and the log says it once."""
    from torchprof_args.capture.stacks import dumper as stacks

    monkeypatch.setattr(stacks, "_py_spy", lambda: None)
    monkeypatch.setitem(stacks._NATIVE_STATE, "said", False)
    first, second = stacks.native_stacks(), stacks.native_stacks()
    assert first["status"] == second["status"] == "unavailable"
    assert "py-spy is not installed" in first["detail"]
    assert sum("no native frames" in line for line in logs.at(logging.WARNING)) == 1


def test_a_thread_in_our_signal_handler_shows_where_the_signal_found_it() -> None:
    """The stacks taken while the main thread runs one of our handlers (a dump in progress) show
    the interrupted frame, not the handler's own work."""
    from torchprof_args.capture.stacks.dumper import mark_signal_handler

    seen: list[list[dict]] = []

    def handler(signum: int, frame: object) -> None:
        seen.append(collect_threads()[0]["frames"])

    mark_signal_handler(handler)
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs on the main thread, right here
    finally:
        signal.signal(signal.SIGUSR1, previous)
    (frames,) = seen
    assert frames[0]["function"] == "test_a_thread_in_our_signal_handler_shows_where_the_signal_found_it"
    assert "os.kill" in frames[0]["code"]
