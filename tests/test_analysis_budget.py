"""The analysis budget: a trace's published analyses within a share of its export's CPU time.

``--torch-profile-analysis-budget``: PyTorch's memory categorisation in the exporter (at most half),
then the sidecar's parts in the publisher; what does not fit is stored as null and named in the
sidecar's ``left_out``, and the tools compute it from the trace.  Unit checks of the CPU-time limit,
the pipeline with a spent and a running-out budget, the compiled and plain replay, and a real 2-rank
job whose first window's memory categorisation alone would hold its exit for ~25 s.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import threading
import time
from pathlib import Path

import msgspec
import pytest
from helpers.paths import DATA, REPO
from helpers.processes import run_torchrun

from torchprof_args.analysis.collect import trace_results
from torchprof_args.analysis.collect.sidecar import stored_parts
from torchprof_args.analysis.collect.trace_results import (
    CRITICAL_PATH,
    DIAGNOSIS,
    MEMORY,
    SUMMARY,
    parse_results,
    results_of,
)
from torchprof_args.capture.runtime.export.job import MIN_ANALYSIS_SECONDS, PublishJob
from torchprof_args.time_limit import Deadline, TimeLimitExceeded, time_limit

TRACE = DATA / "cpu_2rank_manual_dp_rank0.json.gz"


def _spin(seconds: float) -> None:
    """Use ``seconds`` of CPU."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_limit_counts_cpu_and_stops_the_block() -> None:
    started = time.process_time()
    with pytest.raises(TimeLimitExceeded), time_limit(0.2):
        _spin(5.0)
    assert time.process_time() - started < 1.0
    with time_limit(0.2):
        time.sleep(0.4)  # waiting is not CPU: the block ends on its own


def test_off_the_main_thread_the_limit_interrupts_nothing() -> None:
    outcome: list[str] = []

    def work() -> None:
        try:
            with time_limit(0.05):
                _spin(0.3)
            outcome.append("ran to its end")
        except TimeLimitExceeded:
            outcome.append("interrupted")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert outcome == ["ran to its end"]


def test_the_budget_is_a_share_of_the_exports_cpu_time_with_a_floor() -> None:
    job = PublishJob(staged_path="s", trace_path="t", analysis_budget=0.5)
    assert job.analysis_seconds() is None  # the export's time not measured: no limit
    assert dataclasses.replace(job, export_seconds=10.0).analysis_seconds() == 5.0
    assert dataclasses.replace(job, export_seconds=0.1).analysis_seconds() == MIN_ANALYSIS_SECONDS
    assert dataclasses.replace(job, export_seconds=10.0, analysis_budget=0).analysis_seconds() is None
    deadline = dataclasses.replace(job, export_seconds=10.0).analysis_deadline()
    assert deadline.seconds == 5.0 and "0.5 x its export's 10.00 s" in deadline.what
    assert job.analysis_deadline().seconds is None
    assert dataclasses.replace(job, export_seconds=10.0).categorisation_seconds() == 2.5


def _published_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "iter000004-000005"
    folder.mkdir()
    return Path(shutil.copy(TRACE, folder / "rank00000_h_pid1.pt.trace.json.gz"))


def test_a_spent_budget_leaves_the_parts_out_and_the_tools_compute_them(tmp_path: Path) -> None:
    trace = _published_copy(tmp_path)
    outcome = parse_results(trace, (SUMMARY,), top=None, write=True, workers=1,
                            budget=Deadline(0.0, "a test budget"))
    assert outcome.sidecar_written and outcome.results is not None and outcome.results.summary is not None
    assert set(outcome.left_out) == {"diagnosis", "critical_path", "memory"}
    assert all(why == "not started: a test budget was spent" for why in outcome.left_out.values())
    stored = stored_parts(trace)
    assert stored is not None
    assert msgspec.json.decode(stored["diagnosis"]) is None
    summaries = tmp_path / "iter000004-000005" / "summaries"
    sidecar = json.loads(next(summaries.glob("*.summary.json")).read_text())
    assert sidecar["left_out"] == outcome.left_out
    # the tools: from the trace, the same results as a publisher without a budget
    on_demand = results_of(trace, (DIAGNOSIS, CRITICAL_PATH, MEMORY))
    full = parse_results(trace, (DIAGNOSIS, CRITICAL_PATH, MEMORY), workers=1)
    assert not on_demand.from_sidecar and on_demand.results == full.results


def test_a_part_running_past_the_budget_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = dataclasses.replace(CRITICAL_PATH, compute=lambda *args: _spin(30.0))
    monkeypatch.setattr(trace_results, "PARTS", (SUMMARY, DIAGNOSIS, slow, MEMORY))
    trace = _published_copy(tmp_path)
    started = time.process_time()
    # 3 s of CPU: the summary and diagnosis fit (~0.1 s, with any import they pay first even on a
    # loaded host), the 30 s part does not
    outcome = parse_results(trace, (SUMMARY,), top=None, write=True, workers=1,
                            budget=Deadline(3.0, "a test budget"))
    assert time.process_time() - started < 8.0
    assert outcome.left_out == {"critical_path": "stopped: it ran past a test budget",
                                "memory": "not started: a test budget was spent"}  # what came after it
    stored = stored_parts(trace)
    assert stored is not None and msgspec.json.decode(stored["diagnosis"]) is not None


@pytest.mark.slow
def test_a_slow_memory_categorisation_does_not_hold_the_exit(tmp_path: Path) -> None:
    """The demo GPT at 48 layers: PyTorch's categorisation of its first window takes ~25 s of CPU
    against an export of ~1 s; the exporter stops it at its part of the budget, the publisher
    categorises from the trace, and the exit waits for the files alone."""
    proc = run_torchrun(REPO / "integrations" / "demo" / "train_lm.py", "--train-iters", "6",
                        "--num-layers", "48", "--hidden-size", "64", "--micro-batch-size", "2",
                        "--seq-length", "16", "--tensorboard-dir", str(tmp_path / "prof"), "--torch-profile",
                        "--torch-profile-ranks", "0", "--torch-profile-step-start", "4",
                        "--torch-profile-active", "2", "--torch-profile-record-shapes",
                        "--torch-profile-with-stack", "--torch-profile-profile-memory", cwd=tmp_path,
                        TORCHPROF_LOG_LEVEL="DEBUG")
    assert proc.returncode == 0, proc.stderr[-3000:]
    exit_line = next(line for line in proc.stderr.splitlines() if "at exit:" in line)
    assert "1 trace(s) published" in exit_line and "none failed" in exit_line
    slowest = float(exit_line.split("slowest publisher rank 0 (")[1].split(" s)")[0])
    assert slowest < 15.0, exit_line  # the categorisation alone takes ~25 s of CPU
    sidecar = json.loads(next((tmp_path / "prof").glob("iter*/summaries/*.summary.json")).read_text())
    left_out = sidecar.get("left_out", {})
    assert sidecar["summary"] is not None
    for part in ("diagnosis", "critical_path", "memory"):
        assert (sidecar[part] is not None) != (part in left_out), (part, left_out)
    if sidecar["memory"] is not None:
        notes = sidecar["memory"]["notes"]
        assert any("categorisation was stopped in the exporter" in note for note in notes)
    trace = next((tmp_path / "prof").glob("iter*/*.pt.trace.json.gz"))
    with gzip.open(trace) as handle:  # published whole
        assert json.load(handle)["traceEvents"]
