"""The README's demo: a real 2-rank CPU training job of a small GPT with the seed's flag block."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO
from helpers.processes import run_torchrun, subprocess_env

from torchprof_args.shared.metrics_log import read_records

pytestmark = pytest.mark.slow

SEED_FLAG_BLOCK = [
    "--torch-profile", "--torch-profile-ranks", "0", "1", "--torch-profile-wait", "0",
    "--torch-profile-warmup", "1", "--torch-profile-active", "1", "--torch-profile-repeat", "1",
    "--torch-profile-skip-first", "1", "--torch-profile-with-flops", "--torch-profile-profile-memory",
    "--torch-profile-with-stack", "--torch-profile-with-modules",
]


def test_two_rank_training_job_traces_both_ranks(tmp_path):
    """The demo job, two cycles: per-cycle folders HTA reads as they are, sidecars the tools use."""
    run = run_torchrun(REPO / "integrations" / "demo" / "train_lm.py", "--train-iters", "6",
                       "--log-interval", "2", "--tensorboard-dir", str(tmp_path / "tb"), *SEED_FLAG_BLOCK,
                       "--torch-profile-repeat", "2", WANDB_MODE="offline", WANDB_SILENT="true")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    tb = tmp_path / "tb"  # --tensorboard-dir is the default profile dir
    cycles = sorted(p.name for p in tb.glob("iter*"))
    assert cycles == ["iter000003-000003", "iter000005-000005"]
    for cycle in cycles:
        traces = sorted((tb / cycle).glob("*.pt.trace.json.gz"))
        assert [t.name[:9] for t in traces] == ["rank00000", "rank00001"]
        # Nothing but traces beside traces; summaries in their own folder.
        assert sorted(p.name for p in (tb / cycle).iterdir()) == sorted(
            [t.name for t in traces] + ["summaries"])
        assert sorted(p.name for p in (tb / cycle / "summaries").iterdir()) == sorted(
            t.name.replace(".pt.trace.json.gz", suffix)
            for t in traces for suffix in (".operator_table.txt", ".summary.json"))
        for rank, trace in enumerate(traces):
            with gzip.open(trace, "rt") as handle:
                data = json.load(handle)
            assert data["distributedInfo"]["rank"] == rank
            assert any(e.get("name") == f"ProfilerStep#{int(cycle[4:10])}" for e in data["traceEvents"])
            assert any(e.get("name") == "[memory]" for e in data["traceEvents"])
    _hta_reads_each_cycle_as_is(tb, cycles)
    _tools_use_the_sidecars(tb, cycles)
    assert "iteration    6/6" in run.stdout
    # Step timers of both ranks reach the metrics file, including the profiler's own step.
    records = read_records(tb / "metrics.jsonl")  # each run's run / run_end lines are not intervals
    assert [r.iteration for r in records] == [2, 4, 6]
    for key in ("timers/forward-backward-time", "timers/optimizer-time", "timers/batch-generator-time",
                "timers/profiler-step-time", "iteration-time", "throughput/tokens-per-sec"):
        assert all(key in r.metrics for r in records), key
    html = tmp_path / "timings.html"
    dashboard = subprocess.run([sys.executable, "-m", "torchprof_args", "dashboard", str(tb),
                                "-o", str(html)], capture_output=True, text=True, env=subprocess_env())
    assert dashboard.returncode == 0, dashboard.stderr
    assert html.read_text().count("<svg") >= 5


def _hta_reads_each_cycle_as_is(tb, cycles):
    """Live HTA on the folder the job wrote (two cycles, sidecars written): every rank of a cycle."""
    pytest.importorskip("hta")
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    for cycle in cycles:
        analysis = TraceAnalysis(trace_dir=str(tb / cycle))
        assert sorted(analysis.t.get_ranks()) == [0, 1]
        for rank in (0, 1):
            assert Path(analysis.t.trace_files[rank]).parent.name == cycle
            names = analysis.t.symbol_table.get_sym_table()
            assert f"ProfilerStep#{int(cycle[4:10])}" in names


def _tools_use_the_sidecars(tb, cycles):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "torchprof_args", *args, "--no-progress"],
                              capture_output=True, text=True, env=subprocess_env(), timeout=300)

    summary = cli("summary", "--json", str(tb))
    assert summary.returncode == 0 and "parsed" not in summary.stderr, summary.stderr
    views = [json.loads(line) for line in summary.stdout.splitlines() if line.startswith('{"cross_rank"')]
    assert [Path(v["cycle"]).name for v in views] == cycles
    assert all([r["rank"] for r in v["cross_rank"]["ranks"]] == [0, 1] for v in views)
    reparsed = cli("summary", "--json", "--reparse", str(tb))
    assert reparsed.stdout == summary.stdout and "4 trace(s) parsed" in reparsed.stderr
    diff = cli("diff", str(tb / cycles[0]), str(tb / cycles[1]))
    assert diff.returncode == 0 and "CPU operators per rank and step" in diff.stdout, diff.stderr
    report = cli("report", str(tb), "-o", str(tb.parent / "report.html"))
    assert report.returncode == 0 and "2 cycle(s)" in report.stdout, report.stderr


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
                          "--torch-profile-active", "0"],
                         capture_output=True, text=True, env=subprocess_env())
    assert run.returncode == 2
    assert "error: argument --torch-profile-active: must be >= 1" in run.stderr
