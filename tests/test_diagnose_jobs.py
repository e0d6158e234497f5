"""``torchprof diagnose`` on real CPU jobs where the problem is real (2 gloo ranks each): a slow data
loader, a slow rank, a synchronisation the step does not need, a DeepSpeed 2-stage pipeline.

Each job publishes its traces with their sidecars (the per-rank diagnosis computed at publish time);
``diagnose`` reads those, and the finding must be there, named on the right ranks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import JOBS, REPO
from helpers.processes import rank_results, run_torchrun

from torchprof_args.analysis.collect.trace_results import DIAGNOSIS, read_results
from torchprof_args.console import main as torchprof

pytestmark = pytest.mark.slow

PROFILE = ("--torch-profile", "--torch-profile-dir", "prof", "--torch-profile-ranks", "all",
           "--torch-profile-skip-first", "1", "--torch-profile-warmup", "1", "--torch-profile-active", "3")


def run_job(tmp_path: Path, *problem: str) -> Path:
    """Run tests/jobs/diagnose_job.py with ``problem`` on 2 ranks; its run folder."""
    proc = run_torchrun(JOBS / "diagnose_job.py", "--result-dir", str(tmp_path), *problem, *PROFILE,
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["ended"] for r in rank_results(tmp_path).values()} == {"done"}
    return tmp_path / "prof"


def diagnosis(capsys: pytest.CaptureFixture[str], prof: Path) -> dict:
    traces = sorted(prof.glob("*/*.pt.trace.json.gz"))
    assert len(traces) == 2 and all(read_results(t, (DIAGNOSIS,)) is not None for t in traces)  # published
    capsys.readouterr()  # what came before (DeepSpeed's import prints)
    assert torchprof(["diagnose", str(prof), "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def by_kind(doc: dict) -> dict[str, dict]:
    return {f["kind"]: f for f in doc["findings"]}


def test_slow_rank_is_a_straggler(tmp_path, capsys):
    doc = diagnosis(capsys, run_job(tmp_path, "--slow-rank", "1", "--slow-ms", "150"))
    first = doc["findings"][0]
    assert first["kind"] == "straggler" and first["ranks"] == [1]
    assert first["ms_per_step"] > 0.8 * 150
    assert torchprof(["diagnose", str(tmp_path / "prof"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "1. straggler" in text and len(text.splitlines()) <= 30


def test_sleep_in_the_data_loader_is_a_dataloader_stall(tmp_path, capsys):
    doc = diagnosis(capsys, run_job(tmp_path, "--loader-sleep-ms", "150"))
    found = by_kind(doc).get("dataloader_stall")
    assert found is not None, doc["findings"]
    assert found["ranks"] == [0, 1] and found["ms_per_step"] > 0.8 * 150


def test_forced_synchronisation_is_a_host_sync(tmp_path, capsys):
    """On CPU: the step's thread waits right away for a 64 MB metric all-reduce it issued (gloo runs it
    on its worker thread); DDP's own gradient all-reduce, also waited for, is not counted."""
    doc = diagnosis(capsys, run_job(tmp_path, "--sync-mb", "64"))
    found = by_kind(doc).get("host_sync")
    assert found is not None, doc["findings"]
    assert found["ranks"] == [0, 1] and found["share_of_step"] > 0.3
    assert found["evidence"]["calls_per_step"] == 1.0
    assert found["evidence"]["top_calls"][0]["name"] == "c10d::allreduce_"


def test_deepspeed_pipeline_has_a_bubble_per_stage(tmp_path, capsys):
    pytest.importorskip("deepspeed")
    proc = run_torchrun(REPO / "integrations" / "deepspeed" / "train_pipe.py", "--deepspeed_config",
                        str(REPO / "configs" / "ds_pipe_config.json"), "--train-iters", "5",
                        "--torch-profile", "--torch-profile-dir", "prof", "--torch-profile-ranks", "all",
                        "--torch-profile-skip-first", "1", "--torch-profile-active", "2", cwd=tmp_path,
                        WANDB_MODE="disabled")
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = sorted((tmp_path / "prof").glob("*/*.pt.trace.json.gz"))
    for stage, trace in enumerate(traces):
        with gzip.open(trace, "rt") as handle:
            meta = json.load(handle)["torchprof_args"]
        assert meta["pipeline"] == {"stages": 2, "micro_batches": 3, "stage": stage}
    doc = diagnosis(capsys, tmp_path / "prof")
    bubble = by_kind(doc)["pipeline_bubble"]
    assert bubble["ranks"] == [0, 1]
    assert bubble["evidence"]["theoretical_bubble_share"] == pytest.approx(1 / 4)
    parts = [read_results(t, (DIAGNOSIS,)) for t in traces]
    per_stage = {p.diagnosis.rank: p.diagnosis for p in parts if p is not None and p.diagnosis is not None}
    for rank in (0, 1):
        mine = [f for f in per_stage[rank].findings if f.kind == "pipeline_bubble"]
        assert mine and mine[0].evidence["stage"] == rank and mine[0].ms_per_step > 0


def test_doc_example_of_a_cpu_job_with_a_slow_rank(tmp_path):
    proc = run_doc_example("diagnose-cpu-job", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1. straggler" in proc.stdout
    doc = json.loads((tmp_path / "diagnosis.json").read_text())
    first = doc["findings"][0]
    assert doc["version"] == 1 and first["kind"] == "straggler" and first["ranks"] == [1]
