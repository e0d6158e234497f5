"""On-demand tracing on real ranks: a 2-rank gloo job with ``--torch-profile-on-demand`` (no
scheduled tracing) keeps training while ``torchprof trigger`` asks it for traces, by job
directory and by the launcher's pid, and shrugs off a malformed request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO
from helpers.processes import free_port, rank_results, subprocess_env
from test_profiler import profiler_steps, read_trace

JOB = REPO / "tests" / "jobs" / "ondemand_job.py"

pytestmark = pytest.mark.slow


def trigger(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchprof_args", "trigger", *argv], capture_output=True,
                          text=True, timeout=180, env=env)


def listed_paths(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = lines.index("trace files:") + 1
    return [line.strip() for line in lines[start:] if line.startswith("  ")]


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the job exited early:\n{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def test_trigger_traces_the_same_iterations_on_both_ranks(tmp_path):
    prof_dir, stop = tmp_path / "prof", tmp_path / "stop"
    (tmp_path / "tmp").mkdir()  # TMPDIR: torchrun's torchelastic_* logs stay in the test's directory
    env = subprocess_env(TORCHPROF_RUNTIME_DIR=str(tmp_path / "runtime"), TMPDIR=str(tmp_path / "tmp"))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={free_port()}", str(JOB), "--stop-file", str(stop),
         "--result-dir", str(tmp_path / "results"),
         "--torch-profile-on-demand",
         "--torch-profile-on-demand-interval", "5", "--torch-profile-on-demand-check-seconds", "0.5",
         "--torch-profile-dir", str(prof_dir),
         "--no-torch-profile-operator-table"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        control = prof_dir / "ondemand"
        wait_for(control / "job.json", launcher)

        # 1. By job directory (the profile dir), both ranks, waiting for the files.
        first = trigger("--job-dir", str(prof_dir), "--iterations", "3", "--ranks", "0", "1", "--wait",
                        "--timeout", "120", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        paths = listed_paths(first.stdout)
        assert len(paths) == 2 and "all 2 trace(s) written" in first.stdout
        assert [Path(p).name[:9] for p in paths] == ["rank00000", "rank00001"]
        steps = [profiler_steps(p) for p in paths]
        assert steps[0] == steps[1] and len(steps[0]) == 3, steps
        assert steps[0] == list(range(steps[0][0], steps[0][0] + 3))
        assert all(f"/iter{steps[0][0]:06d}-{steps[0][2]:06d}/" in p for p in paths)  # one cycle folder
        (answer,) = [json.loads(p.read_text()) for p in (control / "answers").iterdir()]
        assert answer["window"]["start"] == steps[0][0] and answer["window"]["end"] == steps[0][2] + 1
        assert answer["window"]["warmup_start"] == answer["check_iteration"] + 1
        for rank, path in enumerate(paths):
            data = read_trace(path)
            assert data["distributedInfo"]["rank"] == rank
            assert data["torchprof_args"]["on_demand_request"] == answer["id"]

        # 2. A malformed request is rejected with a reason; the job keeps training.
        junk = control / "requests" / "20000101T000000-junk.json"
        junk.write_text("{not json")
        junk.chmod(0o600)
        junk_answer = control / "answers" / junk.name
        deadline = time.monotonic() + 60
        while not junk_answer.exists():
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.2)
        assert json.loads(junk_answer.read_text())["status"] == "rejected"
        assert "not valid JSON" in json.loads(junk_answer.read_text())["reason"]

        # 3. By the launcher's pid (torchrun is the ranks' parent), one rank only.
        second = trigger("--pid", str(launcher.pid), "--iterations", "2", "--ranks", "1", "--wait",
                         "--timeout", "120", "--json", env=env)
        assert second.returncode == 0, second.stdout + second.stderr
        reply = json.loads(second.stdout)  # --json: the answer alone on stdout
        assert reply["status"] == "accepted" and reply["ranks"] == [1]
        path = reply["traces"]["1"]
        assert Path(path).name.startswith("rank00001_")
        later = profiler_steps(path)
        assert len(later) == 2 and later[0] > steps[0][2]

        # 4. Asking for a rank outside the world is refused before anything is written.
        bad = trigger("--job-dir", str(control), "--ranks", "2", env=env)
        assert bad.returncode == 2 and "outside the job's world size 2" in bad.stderr
    finally:
        stop.touch()
        output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, output[-3000:]
    assert "on-demand request 20000101T000000-junk rejected: the request is not valid JSON" in output
    assert sorted(rank_results(tmp_path / "results")) == [0, 1]
    assert json.loads((prof_dir / "ondemand" / "job.json").read_text())["state"] == "stopped"
    assert not list((tmp_path / "runtime" / "ondemand-jobs").glob("*.json")), "registry entries left behind"
