"""``torchprof mem`` on real CPU jobs of known memory (tests/jobs/memory_job.py: 2 gloo ranks, an MLP
with Adam, fp32), with the problems injected for real: a tensor kept alive across steps on rank 1
(found with its site, its bytes within 5 %; rank 1 named the outlier in ``mem``, ``diagnose`` and
the report) and a larger micro-batch (activations grow as the shapes predict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import JOBS
from helpers.processes import rank_results, run_torchrun

from torchprof_args.analysis.collect.trace_results import MEMORY, read_results
from torchprof_args.console import main as torchprof

pytestmark = pytest.mark.slow

PROFILE = ("--torch-profile", "--torch-profile-dir", "prof", "--torch-profile-ranks", "all",
           "--torch-profile-skip-first", "1", "--torch-profile-warmup", "1", "--torch-profile-active", "3",
           "--torch-profile-profile-memory", "--torch-profile-record-shapes", "--torch-profile-with-stack",
           # the categories are tested here, not the budget (tests/test_analysis_budget.py): on a
           # loaded host PyTorch's categorisation overran its 0.5 s share and the trace's was used
           "--torch-profile-analysis-budget", "0")
KEEP_MB = 2


def run_job(tmp_path: Path, *problem: str) -> tuple[Path, dict[int, dict]]:
    """Run tests/jobs/memory_job.py with ``problem`` on 2 ranks: its run folder and the ranks' truths."""
    proc = run_torchrun(JOBS / "memory_job.py", "--result-dir", str(tmp_path), *problem, *PROFILE,
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    truth = rank_results(tmp_path)
    assert {r["ended"] for r in truth.values()} == {"done"}
    return tmp_path / "prof", truth


def parts(prof: Path) -> dict[int, object]:
    """Each rank's memory part, from its sidecar (written by the publisher with the exporter's)."""
    found = {}
    for trace in sorted(prof.glob("*/*.pt.trace.json.gz")):
        results = read_results(trace, (MEMORY,))
        assert results is not None and results.memory is not None, f"{trace}: no memory part in its sidecar"
        found[results.memory.rank] = results.memory
    return found


def mem_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    capsys.readouterr()
    assert torchprof(["mem", "--json", "--no-progress", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def within(measured: float, truth: float, tolerance: float) -> bool:
    return abs(measured - truth) <= tolerance * truth


@pytest.fixture(scope="module")
def kept_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict]]:
    """Rank 1 keeps a new 2 MiB tensor every step."""
    return run_job(tmp_path_factory.mktemp("kept"), "--keep-mb", str(KEEP_MB), "--keep-ranks", "1")


def test_categories_at_the_peak_equal_the_job_sizes(kept_job: tuple[Path, dict[int, dict]]) -> None:
    prof, truth = kept_job
    for rank, part in parts(prof).items():
        assert part.source == "pytorch", part.notes
        (cpu,) = part.devices
        for name in ("parameter", "gradient", "optimizer_state"):
            measured = getattr(cpu.by_category, name)
            assert within(measured, truth[rank][f"{name}_bytes"], 0.05), (rank, name, cpu)
        for step in cpu.steps:
            assert within(step.activations_for_backward_bytes, truth[rank]["activation_bytes"], 0.20), step
        assert cpu.peak.phase == "optimizer"  # small activations: Adam's workspace tops the step


def test_the_kept_tensor_is_found_with_its_site_and_bytes(kept_job: tuple[Path, dict[int, dict]],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    prof, truth = kept_job
    doc = mem_json(capsys, str(prof))
    kept = [f for f in doc["findings"] if f["kind"] == "retained_tensor"]
    assert len(kept) == 1 and kept[0]["ranks"] == [1], kept
    assert "memory_job.py" in kept[0]["evidence"]["site"] and "ones" in kept[0]["evidence"]["site"]
    assert within(kept[0]["evidence"]["per_step_bytes"], truth[1]["kept_bytes_per_step"], 0.05)
    (outlier,) = doc["outliers"]
    assert outlier["rank"] == 1 and outlier["stage"] is None  # no pipeline, no megatron coordinates
    assert within(outlier["over_median_bytes"], truth[1]["kept_bytes_per_step"], 0.30)  # +2 MiB by step 5
    assert doc["version"] == 1 and set(doc["peak"]["by_category"]) == {
        "parameter", "gradient", "optimizer_state", "activation", "temporary", "other"}


def test_diagnose_and_the_report_name_the_rank(kept_job: tuple[Path, dict[int, dict]],
                                               capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prof, _ = kept_job
    capsys.readouterr()
    assert torchprof(["diagnose", str(prof), "--json", "--no-progress"]) == 0
    found = {f["kind"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert found["memory_imbalance"]["ranks"] == [1], found
    out = tmp_path / "report.html"
    assert torchprof(["report", str(prof), "-o", str(out), "--no-progress"]) == 0
    page = out.read_text()
    assert "Live memory by category, rank 1" in page and "retained_tensor" in page


def test_the_trace_alone_finds_the_same(kept_job: tuple[Path, dict[int, dict]],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--reparse: the traces categorised without the exporter's part (as for traces from elsewhere)."""
    prof, truth = kept_job
    doc = mem_json(capsys, str(prof), "--reparse")
    assert {r["source"] for r in doc["ranks"]} == {"trace"}
    kept = [f for f in doc["findings"] if f["kind"] == "retained_tensor"]
    assert kept and kept[0]["ranks"] == [1]
    assert within(kept[0]["evidence"]["per_step_bytes"], truth[1]["kept_bytes_per_step"], 0.05)
    assert [o["rank"] for o in doc["outliers"]] == [1]


def test_a_larger_micro_batch_grows_activations_as_the_shapes_predict(
        kept_job: tuple[Path, dict[int, dict]], tmp_path: Path) -> None:
    prof, truth = kept_job
    big_prof, big_truth = run_job(tmp_path, "--batch", "256")
    small = parts(prof)[0].devices[0].steps
    big = parts(big_prof)[0].devices[0].steps
    ratio = big_truth[0]["activation_bytes"] / truth[0]["activation_bytes"]  # 4x
    for s, b in zip(small, big, strict=True):
        grown = b.activations_for_backward_bytes / s.activations_for_backward_bytes
        assert within(grown, ratio, 0.20), (s, b)


def test_the_guide_example_runs(tmp_path: Path) -> None:
    proc = run_doc_example("mem-cpu-job", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "retained_tensor" in proc.stdout and "Outlier: rank 1" in proc.stdout
