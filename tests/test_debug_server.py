"""--torch-profile-debug-server: PyTorch's debug server on real 2-rank gloo jobs, its frontend asked
over HTTP on loopback (every rank's stacks, this package's pages, a trace through the on-demand
channel), `torchprof hang` on its periodic dumps of a job that still hangs, and what cannot work
(one line, training goes on)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.logs import LogRecords
from helpers.paths import REPO
from helpers.processes import free_port, kill_job, rank_results, run_torchrun, start_torchrun, wait_until

from torchprof_args.analysis.tools.debug_dumps import find_server_dumps
from torchprof_args.analysis.tools.hang import analyse_dumps
from torchprof_args.capture.runtime.config import DebugServerConfig
from torchprof_args.capture.runtime.debug_server.server import DebugServer, unavailable
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.naming import DEBUG_SERVER_DUMPS
from torchprof_args.torch_support import needs

JOB = REPO / "tests" / "jobs" / "stacks_job.py"
#: Generous: two ranks, their frontend and the test share a loaded 2-core host.
PATIENCE = 240.0


def page(port: int, path: str, timeout: float = 120.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
        return response.read().decode()


def answers(port: int) -> bool:
    try:
        page(port, "/", timeout=5.0)
        return True
    except OSError:
        return False


def torchprof_cli(*argv: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchprof_args", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def server_flags(prof: Path, port: int) -> list[str]:
    return ["--torch-profile-dir", str(prof), "--torch-profile-debug-server",
            "--torch-profile-debug-server-port", str(port), "--torch-profile-debug-server-dump-interval", "1",
            "--torch-profile-flight-recorder", "64"]


@pytest.mark.slow
def test_frontend_shows_every_ranks_stacks_and_this_packages_pages_and_traces_on_request(
        tmp_path: Path) -> None:
    prof, port, stop = tmp_path / "prof", free_port(), tmp_path / "stop"
    job = start_torchrun(JOB, "--result-dir", str(tmp_path), "--iters", "100000", "--step-sleep", "0.02",
                         "--stop-file", str(stop), *server_flags(prof, port), "--torch-profile-on-demand",
                         "--torch-profile-on-demand-check-seconds", "1", cwd=tmp_path)
    try:
        assert wait_until(lambda: answers(port), PATIENCE), (tmp_path / "torchrun.err").read_text()[-3000:]
        home = page(port, "/")
        for link in ("/stacks", "/fr_trace", "/profile", "/torchprof_trace", "/torchprof_brief",
                     "/torchprof_fr_trace"):
            assert f'href="{link}"' in home, home  # PyTorch's pages and this package's, side by side
        stacks = page(port, "/stacks")
        for rank in (0, 1):
            assert f"Rank {rank}: http://" in stacks, stacks
        assert stacks.count("stacks_job.py") >= 2, stacks  # both ranks' training loops

        asked = torchprof_cli("trigger", "--debug-server", f"127.0.0.1:{port}", "--iterations", "2",
                              "--ranks", "all", "--wait", "--timeout", str(PATIENCE))
        assert asked.returncode == 0, asked.stdout + asked.stderr
        traces = [line.strip() for line in asked.stdout.splitlines() if line.startswith("  ")]
        assert len(traces) == 2 and all(Path(t).is_file() for t in traces), asked.stdout
        assert "all 2 trace(s) written" in asked.stdout

        form = page(port, "/torchprof_trace")
        assert "Traces the next N iterations" in form and "<form" in form
        assert wait_until(lambda: list(prof.glob("iter*/summaries/*.summary.json")), PATIENCE)
        brief = page(port, "/torchprof_brief", timeout=300.0)
        expected = torchprof_cli("brief", str(prof), "--max-tokens", "600", "--no-progress")
        assert expected.returncode == 0, expected.stderr
        assert expected.stdout.splitlines()[0].split(":")[0] in brief, (brief, expected.stdout)

        recorders = json.loads(page(port, "/torchprof_fr_trace"))
        assert sorted(recorders["ranks"]) == ["0", "1"]
        assert all(r["recorders"]["gloo"]["entries"] for r in recorders["ranks"].values()), recorders
    finally:
        stop.touch()
        try:
            job.wait(timeout=PATIENCE)
        finally:
            if job.poll() is None:
                kill_job(job)
    err = (tmp_path / "torchrun.err").read_text()
    assert job.returncode == 0, err[-3000:]
    assert {r["ended"] for r in rank_results(tmp_path).values()} == {"done"}
    assert not answers(port), "the frontend outlived the job"
    dumps = prof / "debug_server"
    for name in DEBUG_SERVER_DUMPS.values():  # the newest few kept
        assert 1 <= len(list(dumps.glob(f"{name}_*.txt"))) <= 6, sorted(dumps.iterdir())


@pytest.mark.slow
def test_torchprof_hang_names_the_rank_that_never_joined_from_the_servers_dumps(tmp_path: Path) -> None:
    """Rank 1 blocks in a read before iteration 3's all-reduce and never issues it; rank 0 waits in
    it.  The job still hangs: nothing dumped at a hang yet, only the debug server's periodic dumps."""
    prof, port = tmp_path / "prof", free_port()
    job = start_torchrun(JOB, "--result-dir", str(tmp_path), "--iters", "10", "--pipe-rank", "1",
                         "--at-iteration", "3", "--pg-timeout", "1800", *server_flags(prof, port),
                         cwd=tmp_path)

    def named() -> dict | None:
        if not (tmp_path / "stuck1").exists() or not (prof / "debug_server").is_dir():
            return None
        try:
            report = analyse_dumps(prof)
        except Exception:  # noqa: BLE001 - no whole dump of both ranks yet
            return None
        findings = [f for r in report["recorders"] for f in r["findings"]]
        # the periodic dumps of stacks and of the recorder are taken apart: on a busy host a dump
        # showed rank 1's stack from before its read (in an import) with the recorder's later state
        stuck = "read_from_pipe_nobody_writes" in json.dumps(report.get("where"), default=str)
        return report if stuck and any(f["missing_ranks"] == [1] for f in findings) else None

    try:
        assert wait_until(named, PATIENCE), (tmp_path / "torchrun.err").read_text()[-3000:]
        assert not list((prof / "flight_recorder").iterdir())  # no rank has dumped: they still hang
        done = torchprof_cli("hang", str(prof), "--brief")
    finally:
        kill_job(job)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"torchprof hang: {prof / 'debug_server'}"), out
    assert "rank 1: stacks_job.py:" in out, out
    assert "in read_from_pipe_nobody_writes; never issued gloo:all_reduce" in out, out
    assert "rank 1 did not join gloo:all_reduce" in out and "rank 0 issued it and waits in it" in out, out
    assert "PyTorch's debug server's periodic dump" in out


@pytest.mark.slow
def test_port_in_use_is_one_line_and_training_goes_on(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_torchrun(JOB, "--result-dir", str(tmp_path), "--iters", "3",
                            *server_flags(tmp_path / "p", port), timeout=PATIENCE * 2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {r["ended"] for r in rank_results(tmp_path).values()} == {"done"}
    said = [line for line in done.stderr.splitlines() if "--torch-profile-debug-server-port" in line]
    assert len(said) == 1, said
    assert f"--torch-profile-debug-server-port {port} is in use on this node" in said[0], said
    assert "training goes on without the debug server" in said[0]
    assert "Traceback" not in done.stderr


def test_what_cannot_work_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    torchrun_sets = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "1"}
    for name, value in torchrun_sets.items():
        monkeypatch.setenv(name, value)
    assert unavailable() is None  # this environment has the server and its packages
    missing = unavailable(packages=("jinja2", "no_such_package_for_the_debug_server"))
    assert missing == ("--torch-profile-debug-server: PyTorch's debug server needs "
                       "no_such_package_for_the_debug_server, not installed: pip install "
                       "'torchprof-args[debugserver]'")
    older = types.ModuleType("torch.distributed.debug")  # what a torch without the server has
    assert unavailable(module=older) == needs("--torch-profile-debug-server")
    assert "\n" not in needs("--torch-profile-debug-server")


def test_a_server_that_cannot_start_warns_once_on_rank_0_and_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    records = LogRecords()
    logging.getLogger("torchprof_args").addHandler(records)
    try:
        for rank in (0, 1):
            assert DebugServer(DebugServerConfig(enabled=True), rank).start() is False
    finally:
        logging.getLogger("torchprof_args").removeHandler(records)
    (warning,) = records.at(logging.WARNING)
    assert "launch with torchrun" in warning and warning.endswith("training goes on without the debug server")


def test_flags_need_the_server_and_checked_ports() -> None:
    import argparse

    from torchprof_args import add_torch_profile_args
    from torchprof_args.capture.config import configs_from_args

    parser = add_torch_profile_args(argparse.ArgumentParser())
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-debug-server-dump-interval needs "
                                                    "--torch-profile-debug-server"):
        configs_from_args(parser.parse_args(["--torch-profile-debug-server-dump-interval", "5"]), 2)
    with pytest.raises(SystemExit):
        parser.parse_args(["--torch-profile-debug-server", "--torch-profile-debug-server-port", "70000"])
    args = parser.parse_args(["--torch-profile-debug-server", "--torch-profile-dir", "d"])
    config = configs_from_args(args, 2).profiler.debug_server
    assert (config.port, config.dump_interval, config.dump_dir, config.control_dir) == (
        25999, 60.0, "d/debug_server", None)


def test_trigger_through_a_server_that_is_not_there_is_one_line() -> None:
    port = free_port()
    done = torchprof_cli("trigger", "--debug-server", f"127.0.0.1:{port}", "--timeout", "5")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and f"--debug-server 127.0.0.1:{port}: no answer" in done.stderr
    with pytest.raises(urllib.error.URLError):
        page(port, "/", timeout=5.0)


@pytest.mark.slow
def test_docs_example_a_job_that_still_hangs(tmp_path: Path) -> None:
    """docs/guides/hang-forensics.md's example, verbatim: the frontend shows both ranks' stacks
    while the job hangs, and `torchprof hang` on the server's dumps names rank 1."""
    done = run_doc_example("debug-server", tmp_path, timeout=900, DEBUG_PORT=str(free_port()))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "<h2>Rank 0: http://" in done.stdout and "<h2>Rank 1: http://" in done.stdout, done.stdout
    assert "torchprof hang: prof/debug_server" in done.stdout, done.stdout
    assert "rank 1 did not join gloo:all_reduce #2" in done.stdout, done.stdout


def _stacks_dump(innermost: str) -> str:
    """PyTorch's stacks dump of one rank (faulthandler's text), its main thread in ``innermost``."""
    return ("=== Rank 1: http://node1:52271/handler/dump_traceback? ===\n"
            "Current thread 0x00007facb3fff6c0 (most recent call first):\n  <no Python frame>\n\n"
            "Thread 0x00007face1e97b80 (most recent call first):\n"
            f'  File "/job/stacks_job.py", line 44 in {innermost}\n'
            '  File "/job/stacks_job.py", line 100 in <module>\n')


def _dump_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A debug-server folder with an older stacks dump (rank 1 still importing) and the newest one's
    path (as PyTorch's dumper names them: the second each was taken in)."""
    folder = tmp_path / "debug_server"
    folder.mkdir()
    stem = DEBUG_SERVER_DUMPS["stacks"]
    (folder / f"{stem}_20261129_203454.txt").write_text(_stacks_dump("_compile_bytecode"))
    return folder, folder / f"{stem}_20261129_203455.txt"


def test_the_newest_dump_is_read_once_written_not_passed_over_for_an_older_one(tmp_path: Path) -> None:
    """PyTorch's dumper writes a dump in place (a second one within the same second rewrites it):
    found empty while it is written, the newest dump is read again once whole, not passed over for
    the older one, which shows rank 1 from before it got stuck."""
    _, newest = _dump_folder(tmp_path)
    newest.write_text("")  # opened for writing, not written yet
    writer = threading.Timer(0.3, newest.write_text, args=(_stacks_dump("read_from_pipe_nobody_writes"),))
    writer.start()
    try:
        found = find_server_dumps(tmp_path)
    finally:
        writer.join()
    assert found is not None and not found.problems, found
    assert found.stacks[1]["threads"][0]["frames"][0]["function"] == "read_from_pipe_nobody_writes"


def test_an_empty_dump_left_long_ago_gives_way_to_the_one_before(tmp_path: Path) -> None:
    """A newest dump that stayed empty (a frontend stopped while writing it) is passed over at once
    for the one before it."""
    _, newest = _dump_folder(tmp_path)
    newest.write_text("")
    os.utime(newest, (1.0, 1.0))
    found = find_server_dumps(tmp_path)
    assert found is not None and found.stacks[1]["threads"][0]["frames"][0]["function"] == "_compile_bytecode"
