"""The core issue on 2 GPUs with NCCL: rank 0's trace flush outlasts a 5 s NCCL timeout.

``tests/jobs/nccl_flush_job.py`` adds 12 s to rank 0's export.  The stock trace handler leaves
rank 1 waiting in an all-reduce and the NCCL watchdog ends the job; TorchProfiler (export inline,
so that the 12 s really stall the training thread) holds every rank at its gloo fence and the job
finishes with a whole trace of GPU and NCCL kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cuda import requires_gpus
from helpers.paths import JOBS
from helpers.processes import rank_results, run_torchrun

from torchprof_args.analysis import load_trace, summarize

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(2), pytest.mark.timeout(400)]

JOB = JOBS / "nccl_flush_job.py"
PG_TIMEOUT, EXPORT_DELAY = 5.0, 12.0
#: Skip 1 step, warm up 1, record iterations 3-4: the flush is at iteration 4 (index 3).
SCHEDULE = ["--torch-profile-skip-first", "1", "--torch-profile-warmup", "1", "--torch-profile-active", "2"]
FLUSH = 3


def run_job(tmp_path: Path, mode: str, *extra: str):
    return run_torchrun(
        JOB,
        "--mode",
        mode,
        "--pg-timeout",
        str(PG_TIMEOUT),
        "--export-delay",
        str(EXPORT_DELAY),
        "--torch-profile-dir",
        str(tmp_path / "prof"),
        "--result-dir",
        str(tmp_path / "results"),
        *SCHEDULE,
        *extra,
        nproc=2,
        timeout=300,
    )


def test_stock_handler_dies_of_the_nccl_timeout(tmp_path: Path) -> None:
    run = run_job(tmp_path, "stock")
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert "timeout" in output.lower() or "timed out" in output.lower(), output[-3000:]
    assert 1 not in rank_results(tmp_path / "results"), "rank 1 should not have finished"


def test_torchprofiler_fences_the_flush_and_both_ranks_finish(tmp_path: Path) -> None:
    run = run_job(tmp_path, "torchprof", "--torch-profile", "--torch-profile-export", "inline")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    results = rank_results(tmp_path / "results")
    assert set(results) == {0, 1}
    for rank in (0, 1):  # the stall really outlasted the NCCL timeout, on both ranks
        assert results[rank]["times"][FLUSH] > PG_TIMEOUT, results[rank]["times"]
    assert results[0]["sum"] == results[1]["sum"], "the all-reduces after the flush disagree"
    (trace,) = (tmp_path / "prof").rglob("rank00000_*.pt.trace.json.gz")
    assert trace.parent.name == "iter000003-000004"
    summary = summarize(load_trace(trace))
    assert summary.backend == "nccl" and summary.world_size == 2
    assert summary.gpu is not None and summary.gpu.kernels > 0
    assert any(k.type == "communication" for k in summary.top_kernels), summary.top_kernels[:5]
