"""The heart of the core issue, on real ranks: 2 gloo ranks with a 3 s collective timeout and a
trace flush on rank 0 that takes longer than that.  The stock handler kills the other rank;
TorchProfiler's fenced flush lets both finish with a valid trace."""

from __future__ import annotations

import gzip
import json

import pytest
from helpers.paths import REPO
from helpers.processes import rank_results, run_torchrun

JOB = REPO / "tests" / "jobs" / "flush_job.py"
HEAVY = ["--pg-timeout", "3", "--iters", "14", "--layers", "24", "--torch-profile-active", "10",
         "--torch-profile-record-shapes", "--torch-profile-profile-memory", "--torch-profile-with-stack"]

pytestmark = pytest.mark.slow


def test_stock_trace_handler_dies_of_the_collective_timeout(tmp_path):
    run = run_torchrun(JOB, "--mode", "stock", "--torch-profile-dir", str(tmp_path / "prof"),
                       "--result-dir", str(tmp_path / "results"), *HEAVY)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert "Timed out" in output or "timed out" in output.lower(), output[-3000:]
    assert 1 not in rank_results(tmp_path / "results"), "rank 1 should not have finished"


def test_torchprofiler_fences_the_flush_and_both_ranks_finish(tmp_path):
    prof_dir = tmp_path / "prof"
    run = run_torchrun(JOB, "--mode", "torchprof", "--torch-profile", "--torch-profile-dir", str(prof_dir),
                       "--result-dir", str(tmp_path / "results"), *HEAVY)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    finished = rank_results(tmp_path / "results")
    assert set(finished) == {0, 1}
    (trace,) = [p for p in prof_dir.rglob("*") if p.name.endswith(".pt.trace.json.gz")]
    assert trace.name.startswith("rank00000_") and trace.parent.name == "iter000003-000012"
    with gzip.open(trace, "rt") as handle:
        data = json.load(handle)
    steps = sorted(int(e["name"].split("#")[1]) for e in data["traceEvents"]
                   if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == list(range(3, 13))
    assert data["distributedInfo"]["world_size"] == 2 and data["distributedInfo"]["rank"] == 0
    assert data["torchprof_args"]["world_size"] == 2
    assert not [p for p in prof_dir.iterdir() if p.name.startswith(".partial")]
