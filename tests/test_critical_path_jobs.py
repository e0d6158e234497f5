"""The critical path on real 2-rank gloo jobs (``tests/jobs/diagnose_job.py`` under torchrun): the path
is as long as every step, a stalled rank moves the path onto itself and the graph predicts what
removing the stall saves, and the guide's worked example (two problems on different ranks) runs.

How close the predictions come to re-runs, case by case, is ``benchmarks/bench_whatif.py``'s (too
slow for the test suite; docs/benchmarks.md has its table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import JOBS
from helpers.processes import rank_results, run_torchrun

from torchprof_args.console import main as torchprof

pytestmark = pytest.mark.slow

PROFILE = ("--torch-profile", "--torch-profile-dir", "prof", "--torch-profile-ranks", "all",
           "--torch-profile-skip-first", "3", "--torch-profile-warmup", "1", "--torch-profile-active", "4")


def _job(tmp_path: Path, *problem: str) -> Path:
    proc = run_torchrun(JOBS / "diagnose_job.py", "--result-dir", str(tmp_path), "--iters", "10", *problem,
                        *PROFILE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["ended"] for r in rank_results(tmp_path).values()} == {"done"}
    return tmp_path / "prof"


def test_a_stalled_rank_carries_the_path_and_its_saving_is_predicted(tmp_path: Path, capsys) -> None:
    prof = _job(tmp_path, "--slow-rank", "1", "--slow-ms", "60")
    capsys.readouterr()
    assert torchprof(["critical-path", str(prof), "--json", "--no-progress",
                      "--what-if", "rank 1 like the median", "--what-if", "rank 0 like the median"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranks"] == 2 and len(doc["steps"]) == 4
    for step in doc["steps"][1:]:  # the first may start where the other rank's trace begins
        assert step["path_ms"] == pytest.approx(step["step_ms"], rel=0.02)
        assert step["by_rank"].get("1", 0.0) >= 0.8 * 60, step
    fixed, other = doc["what_if"]
    assert fixed["saving_ms_per_step"] == pytest.approx(60, rel=0.15)
    assert other["saving_ms_per_step"] < 3
    assert torchprof(["diagnose", str(prof), "--json", "--no-progress"]) == 0
    found = {f["kind"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    straggler = found["straggler"]
    assert straggler["saving_basis"] == "critical path" and straggler["ranks"] == [1]
    assert straggler["saving_ms_per_step"] <= straggler["bound_ms_per_step"]  # never more than the bound
    expected = min(fixed["saving_ms_per_step"], straggler["bound_ms_per_step"])
    assert straggler["saving_ms_per_step"] == pytest.approx(expected, abs=0.5)


def test_doc_example_of_two_problems_on_two_ranks(tmp_path: Path) -> None:
    proc = run_doc_example("critical-path-cpu-job", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("torchprof critical-path: 2 ranks")
    loader = next(line for line in lines if line.startswith("what if no data loader"))
    median = next(line for line in lines if line.startswith("what if rank 1 like the median"))
    saves = [float(line.split("saves ")[1].split(" ms")[0]) for line in (loader, median)]
    # rank 0's 40 ms loader less rank 1's 25 ms of matrix products (their wall time: the host is shared),
    # then nothing: rank 1 like the median still waits for rank 0's loader
    doc = json.loads((tmp_path / "diagnosis.json").read_text())
    stall = {f["kind"]: f for f in doc["findings"]}["dataloader_stall"]
    assert stall["ranks"] == [0] and stall["bound_ms_per_step"] > 35, stall
    assert 3 < saves[0] < 0.7 * stall["bound_ms_per_step"] and saves[1] < min(3.0, saves[0]), lines
    assert stall["saving_ms_per_step"] == pytest.approx(saves[0], abs=1.0)
