"""The README's demo: a real 2-rank CPU training job of a small GPT with the seed's flag block."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from conftest import REPO, run_torchrun, subprocess_env

pytestmark = pytest.mark.slow

SEED_FLAG_BLOCK = [
    "--torch-profile", "--torch-profile-ranks", "0", "1", "--torch-profile-wait", "0",
    "--torch-profile-warmup", "1", "--torch-profile-active", "1", "--torch-profile-repeat", "1",
    "--torch-profile-skip-first", "1", "--torch-profile-with-flops", "--torch-profile-profile-memory",
    "--torch-profile-with-stack", "--torch-profile-with-modules",
]


def test_two_rank_training_job_traces_both_ranks(tmp_path):
    run = run_torchrun(REPO / "integrations" / "demo" / "train_lm.py", "--train-iters", "6", "--log-interval", "2",
                       "--tensorboard-dir", str(tmp_path / "tb"), *SEED_FLAG_BLOCK,
                       WANDB_MODE="offline", WANDB_SILENT="true")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    traces = sorted((tmp_path / "tb").glob("*.pt.trace.json.gz"))  # --tensorboard-dir is the default dir
    assert [t.name[:9] for t in traces] == ["rank00000", "rank00001"]
    for rank, trace in enumerate(traces):
        with gzip.open(trace, "rt") as handle:
            data = json.load(handle)
        assert data["distributedInfo"]["rank"] == rank
        assert any(e.get("name") == "ProfilerStep#3" for e in data["traceEvents"])
        assert any(e.get("name") == "[memory]" for e in data["traceEvents"])
    assert "iteration    6/6" in run.stdout
    # Step timers of both ranks reach the metrics file, including the profiler's own step.
    records = [json.loads(line) for line in (tmp_path / "tb" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [2, 4, 6]
    for key in ("timers/forward-backward-time", "timers/optimizer-time", "timers/batch-generator-time",
                "timers/profiler-step-time", "iteration-time", "throughput/tokens-per-sec"):
        assert all(key in r["metrics"] for r in records), key
    html = tmp_path / "timings.html"
    dashboard = subprocess.run([sys.executable, "-m", "torchprof_args", "dashboard", str(tmp_path / "tb"),
                                "-o", str(html)], capture_output=True, text=True, env=subprocess_env())
    assert dashboard.returncode == 0, dashboard.stderr
    assert html.read_text().count("<svg") >= 5


def test_bad_flags_fail_before_training_with_one_line(tmp_path):
    run = run_torchrun(REPO / "integrations" / "demo" / "train_lm.py", "--torch-profile",
                       "--torch-profile-ranks", "0", "7", "--torch-profile-dir", str(tmp_path))
    assert run.returncode != 0
    assert "error: --torch-profile-ranks 7 outside the world size 2" in run.stderr
    assert "iteration" not in run.stdout
    # torchrun reports the failed ranks itself; the ranks print one line, not a traceback.
    assert "raise TorchProfileArgsError" not in run.stderr


def test_single_flag_error_exits_2_in_parse_args():
    run = subprocess.run([sys.executable, str(REPO / "integrations" / "demo" / "train_lm.py"),
                          "--torch-profile-active", "0"], capture_output=True, text=True, env=subprocess_env())
    assert run.returncode == 2
    assert "error: argument --torch-profile-active: must be >= 1" in run.stderr
