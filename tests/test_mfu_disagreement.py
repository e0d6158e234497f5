"""``mfu_disagreement`` on a real 2-rank job (tests/jobs/mfu_job.py) that logs the step timers' MFU
from ``--metrics-flops-per-iteration`` and is traced with shapes: the right formula agrees with the
traces' counted FLOPs (to the closed form), a formula that forgot the backward is a finding naming
the direction, and a bad ``--metrics`` is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.paths import JOBS
from helpers.processes import run_torchrun

from torchprof_args.analysis.diagnose.step_timers import find_metrics
from torchprof_args.console import main as torchprof

pytestmark = pytest.mark.slow

WIDTHS, BATCH, WORLD = (64, 1024, 1024, 64), 32, 2
#: the weights' multiply-adds per sample
WEIGHTS = sum(a * b for a, b in zip(WIDTHS, WIDTHS[1:], strict=False))
#: what the traces count per rank and step: forward 2x, each weight gradient 2x, each input gradient 2x
#: but the first layer's (its input needs none)
COUNTED = 2 * BATCH * (3 * WEIGHTS - WIDTHS[0] * WIDTHS[1])


def _run(folder: Path, flops_per_iteration: float) -> Path:
    proc = run_torchrun(JOBS / "mfu_job.py", "--iters", "8", "--metrics-dir", str(folder),
                        "--metrics-flops-per-iteration", repr(flops_per_iteration),
                        "--metrics-peak-tflops", "1", "--metrics-sinks", "jsonl",
                        "--torch-profile", "--torch-profile-dir", str(folder / "prof"),
                        "--torch-profile-ranks", "all", "--torch-profile-record-shapes",
                        "--torch-profile-skip-first", "3", "--torch-profile-active", "2", cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder / "prof"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The job with the right formula (6 x batch x weights, every rank's batch) and with one that
    counts the forward only."""
    right = 6.0 * BATCH * WEIGHTS * WORLD
    return {"right": _run(tmp_path_factory.mktemp("right"), right),
            "forward_only": _run(tmp_path_factory.mktemp("forward"), right / 3)}


def _diagnosis(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    capsys.readouterr()
    assert torchprof(["diagnose", *argv, "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_right_formula_agrees_with_the_traces(runs: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    doc = _diagnosis(capsys, str(runs["right"]))
    assert not any(f["kind"] == "mfu_disagreement" for f in doc["findings"]), doc["findings"]
    # the same comparison with no threshold: the traces count the closed form, the formula 1.9 % more
    found = _diagnosis(capsys, str(runs["forward_only"]))
    (finding,) = [f for f in found["findings"] if f["kind"] == "mfu_disagreement"]
    counted = finding["evidence"]["counted_flops_per_rank"]
    assert counted == {"0": float(f"{COUNTED:.4g}"), "1": float(f"{COUNTED:.4g}")}


def test_a_formula_without_the_backward_is_a_finding(runs: dict[str, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    doc = _diagnosis(capsys, str(runs["forward_only"]))
    (finding,) = [f for f in doc["findings"] if f["kind"] == "mfu_disagreement"]
    evidence = finding["evidence"]
    assert finding["ranks"] == [0, 1] and finding["saving_ms_per_step"] == 0.0
    assert evidence["formula_over_counted"] == pytest.approx(2.0 * BATCH * WEIGHTS / COUNTED, rel=1e-3)
    assert evidence["formula_intervals_of"] == "the traced iterations"
    assert evidence["formula_source"] == str(runs["forward_only"].parent / "metrics.jsonl")
    assert "the traces count 2.94x as many" in finding["summary"] and "recomputation" in finding["remedy"]
    assert "75.5 MFLOPs per GPU and iteration" in finding["summary"]  # the formula's: 2 x 32 x 1.18M
    # the text names it; --metrics given explicitly reads the same file
    assert torchprof(["diagnose", str(runs["forward_only"]), "--no-progress"]) == 0
    assert "mfu_disagreement" in capsys.readouterr().out
    again = _diagnosis(capsys, str(runs["forward_only"]), "--metrics", str(runs["forward_only"].parent))
    assert [f for f in again["findings"] if f["kind"] == "mfu_disagreement"] == [finding]


def test_a_bad_metrics_file_is_one_line(runs: dict[str, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    prof = str(runs["right"])
    assert torchprof(["diagnose", prof, "--metrics", str(tmp_path / "none.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--metrics" in err and "none.jsonl" in err and "Traceback" not in err
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"iteration": "x"}\n')
    assert torchprof(["diagnose", prof, "--metrics", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "not a readable metrics.jsonl" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_metrics_file_outside_the_roots_is_not_read(runs: dict[str, Path]) -> None:
    traces = sorted(runs["right"].glob("iter*/*.pt.trace.json.gz"))
    assert find_metrics(traces) == runs["right"].parent / "metrics.jsonl"
    assert find_metrics(traces, within=[str(runs["right"].resolve())]) is None  # torchprof mcp's roots
