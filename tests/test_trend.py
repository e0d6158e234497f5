"""``torchprof trend``: the change test (scipy's U test as called, the modified z-score), the report
and the command, and real CPU runs: ten alike and one 3 % slower."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.examples import run_doc_example
from helpers.paths import REPO

from torchprof_args.analysis.trend.change_test import (
    compare,
    false_positive_rate,
    modified_z,
    u_test_p,
)
from torchprof_args.analysis.trend.report import (
    format_trend,
    noise_splits,
    regression_gate,
    render_trend_html,
    trend,
)
from torchprof_args.analysis.trend.series import RunData, read_input
from torchprof_args.console import main as torchprof
from torchprof_args.errors import CommandError, ExitStatus
from torchprof_args.shared.metrics_log import RunMarker


def test_u_test_is_scipys_two_sided_asymptotic_test(monkeypatch: pytest.MonkeyPatch) -> None:
    # R's wilcox.test example: wilcox.test(x, y, exact = FALSE) gives p = 0.2446 (two-sided, with the
    # continuity correction); ties take the variance's tie correction; all equal: no evidence at all
    x = [0.80, 0.83, 1.89, 1.04, 1.45, 1.38, 1.91, 1.64, 0.73, 1.46]
    y = [1.15, 0.88, 0.90, 0.74, 1.21]
    assert u_test_p(x, y) == pytest.approx(0.2446, abs=1e-4) == u_test_p(y, x)
    assert u_test_p([1, 1, 2], [1, 2, 2]) == pytest.approx(0.6193, abs=1e-4)
    assert u_test_p([5.0] * 6, [5.0] * 6) == 1.0
    # without the trend extra: one sentence that says what to install
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    with pytest.raises(CommandError, match=r"needs scipy: pip install 'torchprof-args\[trend\]'"):
        u_test_p(x, y)


def test_modified_z_score() -> None:
    references = [10.0, 10.2, 9.9, 10.1, 10.0]  # median 10, MAD 0.1
    assert modified_z(10.5, references) == pytest.approx(0.6745 * 0.5 / 0.1)
    assert modified_z(10.0, [10.0, 10.0, 10.0]) == 0.0
    assert modified_z(11.0, [10.0, 10.0, 10.0]) == math.inf


def _runs(
    rng: np.random.Generator, count: int, level: float, spread: float, steps: int = 60
) -> list[list[float]]:
    """Runs of ``steps`` step times: a run-level offset (spread) plus one-sided per-step noise."""
    return [
        list(level * (1 + rng.normal(0, spread)) + rng.exponential(0.02 * level, steps)) for _ in range(count)
    ]


def test_compare_flags_a_shift_beyond_the_run_to_run_noise_only() -> None:
    rng = np.random.default_rng(1)
    baseline = _runs(rng, 10, 1.0, 0.002)
    slower = compare(_runs(rng, 1, 1.03, 0.0)[0], baseline)
    assert slower.verdict == "regression" and 2.0 < slower.change_pct < 4.0 and slower.z > 3.5
    faster = compare(_runs(rng, 1, 0.97, 0.0)[0], baseline)
    assert faster.verdict == "improvement"
    # the same 3 % among runs that differ by 3 % anyway: the samples differ (U test), the runs do not
    noisy = _runs(rng, 10, 1.0, 0.03)
    assert compare(_runs(rng, 1, 1.03, 0.0)[0], noisy).verdict == "same"
    assert compare(_runs(rng, 1, 1.0, 0.0)[0], baseline).verdict == "same"
    # higher is better (MFU): lower is the regression, measured at the upper quantile
    mfu = compare([40.0] * 30, [[50.0 + i * 0.01] * 30 for i in range(5)], higher_is_better=True)
    assert mfu.verdict == "regression" and mfu.change_pct == pytest.approx(-20.0, abs=0.1)
    flagged, splits = false_positive_rate(baseline, splits=100)
    assert splits == 100 and flagged <= 5


def _run(path: Path, label: str, samples: list[float]) -> RunData:
    data = RunData(str(path), label)
    for value in samples:
        data.add("iteration-time", "s", value)
    return data


def test_report_json_text_and_html() -> None:
    rng = np.random.default_rng(2)
    baseline = [_run(Path(f"run{i}"), f"run{i}", r) for i, r in enumerate(_runs(rng, 6, 0.02, 0.002))]
    candidate = _run(Path("new"), "new", _runs(rng, 1, 0.0206, 0.0)[0])
    doc = trend([candidate], baseline, splits=50)
    assert doc["version"] == 1 and [r["series"] for r in doc["regressions"]] == ["iteration-time"]
    (series,) = doc["series"]
    assert series["baseline"]["runs"] == 6 and series["results"][0]["verdict"] == "regression"
    assert doc["noise_check"]["splits"] == 50
    json.dumps(doc, allow_nan=False)
    text = format_trend(doc)
    assert "iteration-time" in text and "REGRESSION" in text and "noise check:" in text
    page = render_trend_html(doc)
    assert page.count("<svg class='trend'") == 1 and page.count("<circle") == 7


def _metrics_run(folder: Path, step_times: list[float], start: float = 1000.0) -> Path:
    folder.mkdir(parents=True)
    lines = [json.dumps(RunMarker("x", start, 0, start - 1.0).record())]
    now = start
    for step, seconds in enumerate(step_times, start=1):
        now += seconds
        lines.append(
            json.dumps(
                {
                    "iteration": step,
                    "timestamp": now,
                    "metrics": {
                        "iteration-time": seconds,
                        "timers/forward-backward-time": seconds / 2,
                        "mfu": 40.0,
                    },
                }
            )
        )
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_series_from_metrics_jsonl_skip_the_first_interval(tmp_path: Path) -> None:
    data = read_input(str(_metrics_run(tmp_path / "r", [5.0, 1.0, 1.1, 1.2])))
    assert data.series["iteration-time"].samples == [1.0, 1.1, 1.2]
    assert data.series["timers/forward-backward-time"].samples == [0.5, 0.55, 0.6]
    assert data.series["mfu"].higher_is_better and not data.series["iteration-time"].higher_is_better


def test_trend_command_last_run_against_the_others_and_errors(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(3)
    paths = [
        str(_metrics_run(tmp_path / f"run{i}", [0.5, *r])) for i, r in enumerate(_runs(rng, 5, 0.02, 0.001))
    ]
    slow = str(_metrics_run(tmp_path / "slow", [0.5, *_runs(rng, 1, 0.0208, 0.0)[0]]))
    html = tmp_path / "trend.html"
    assert torchprof(["trend", *paths, slow, "--json", "--html", str(html), "--series", "iteration"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"] == paths and doc["inputs"] == [slow]
    assert [s["name"] for s in doc["series"]] == ["iteration-time"]
    assert doc["regressions"][0]["series"] == "iteration-time" and html.read_text().startswith(
        "<!DOCTYPE html>"
    )
    assert torchprof(["trend", paths[0]]) == 2
    assert "error: give at least two runs" in capsys.readouterr().err
    assert torchprof(["trend", str(tmp_path / "nope"), paths[0]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchprof trend: error: ") and "no such file or directory" in err
    (tmp_path / "empty").mkdir()
    assert torchprof(["trend", str(tmp_path / "empty"), paths[0]]) == 2
    assert "neither a metrics.jsonl with logged intervals nor profiler traces" in capsys.readouterr().err


@pytest.mark.slow
def test_ten_runs_alike_and_one_three_percent_slower(tmp_path: Path, capsys) -> None:
    """The operations guide's example: ten runs of a real CPU job (per-step samples, the machine's
    run-to-run noise) and one whose step is 3 % slower.  No run of the ten is flagged against the other
    nine, the slower one is, and the rule's false-positive rate over random splits is printed."""
    proc = run_doc_example("operations-trend", tmp_path, timeout=600, TORCHPROF_LOG_LEVEL="WARNING")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "noise check: the same rule flags" in proc.stdout
    assert (tmp_path / "trend.html").read_text().count("<svg class='trend'") == 1
    out = tmp_path / "runs"
    runs = sorted(str(p) for p in out.glob("run*"))
    baseline = [read_input(p) for p in runs]
    assert len(baseline) == 10
    doc = trend([read_input(str(out / "slower"))], baseline, splits=500)
    check = doc["noise_check"]
    series = next(s for s in doc["series"] if s["name"] == "iteration-time")
    levels = np.asarray(series["baseline"]["run_levels"])
    spread = (levels.max() - levels.min()) / np.median(levels) * 100
    with capsys.disabled():
        print(
            f"\ntrend: the ten runs' levels within {spread:.2f} %; false-positive rate over "
            f"{check['splits']} random splits of them: {check['false_positive_rate']:.1%} "
            f"({check['flagged']} flagged); the slower run: {format_trend(doc).splitlines()[5].strip()}"
        )
    if spread > 1.5:  # the host's load shifted whole runs: they are not ten runs alike
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        pytest.skip(
            f"the ten runs' levels spread over {spread:.1f} % (load {load}): the machine shifted whole "
            "runs, so they are not alike; rerun on a quieter machine"
        )
    for index, run in enumerate(baseline):
        others = baseline[:index] + baseline[index + 1 :]
        assert not trend([run], others, splits=0)["regressions"], f"{run.path} flagged against the others"
    assert check["false_positive_rate"] <= 0.05
    (result,) = series["results"]
    assert 1.5 < result["change_pct"] < 4.5  # the 3 % the job added, as measured
    assert [r["series"] for r in doc["regressions"]] == ["iteration-time"], format_trend(doc)


@pytest.mark.slow
def test_series_from_traces_step_times_and_findings(tmp_path: Path) -> None:
    """Cycle folders of real traces (tests/data's H200 pair: the same job, clean and with injected
    faults): each step's time and every diagnose finding's saving become series."""
    cycles = {}
    for name in ("clean", "faulty"):
        folder = tmp_path / name / "iter000010-000012"
        folder.mkdir(parents=True)
        (folder / "rank00000_h200_pid1.pt.trace.json.gz").write_bytes(
            (REPO / "tests" / "data" / f"gpu_1rank_h200_torchprof_{name}.json.gz").read_bytes()
        )
        cycles[name] = read_input(str(tmp_path / name))
    for data in cycles.values():
        assert len(data.series["trace/step-ms"].samples) >= 2
        assert all(len(s.samples) == 1 for n, s in data.series.items() if n.startswith("diagnose/"))
    found = {n for n, s in cycles["faulty"].series.items() if n.startswith("diagnose/") and s.samples[0] > 0}
    assert found, "the faulty trace has findings"
    doc = trend([cycles["faulty"]], [cycles["clean"]], splits=0)
    assert {s["name"] for s in doc["series"]} >= {"trace/step-ms"} | found
    assert doc["noise_check"] is None  # one baseline run: no splits to check


def _gate_failures(runs: list[list[float]] | list[RunData], splits: int) -> int:
    """How many of the noise check's random splits of ``runs`` (runs that differ only by noise) the
    gate fails: each split's run against its baseline runs, the report's regressions."""
    data = [r if isinstance(r, RunData) else _run(Path(f"run{i}"), f"run{i}", r) for i, r in enumerate(runs)]
    return sum(
        regression_gate(trend([data[index]], [data[i] for i in others], splits=0)) is not None
        for index, others in noise_splits(len(data), splits)
    )


def _alike_runs(tmp_path: Path, rng: np.random.Generator) -> tuple[list[list[float]], list[str]]:
    """Ten runs that differ only by noise, as metrics.jsonl files: their samples and paths."""
    alike = _runs(rng, 10, 0.02, 0.002)
    return alike, [str(_metrics_run(tmp_path / f"run{i:02d}", [0.5, *r])) for i, r in enumerate(alike)]


def test_fail_on_regression_fails_a_three_percent_slower_run_after_the_report(tmp_path: Path, capsys) -> None:
    """The CI gate: a run 3 % slower exits with status 3 (REGRESSION) naming the series on one line,
    after the whole --json report; an improvement passes, and without the flag the exit is 0."""
    rng = np.random.default_rng(4)
    _, paths = _alike_runs(tmp_path, rng)
    slower = str(_metrics_run(tmp_path / "slower", [0.5, *_runs(rng, 1, 0.0206, 0.0)[0]]))
    argv = ["trend", slower, "--baseline", *paths, "--fail-on-regression", "--json", "--splits", "0"]
    status = torchprof(argv)
    assert status == ExitStatus.REGRESSION == 3
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # the report, whole, before the gate's verdict
    assert {r["series"] for r in doc["regressions"]} == {"iteration-time", "timers/forward-backward-time"}
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("torchprof trend: error: regression beyond the baseline runs' noise")
    assert "iteration-time +3." in captured.err and "timers/forward-backward-time +3." in captured.err
    assert "in slower" in captured.err
    faster = str(_metrics_run(tmp_path / "faster", [0.5, *_runs(rng, 1, 0.0194, 0.0)[0]]))
    assert torchprof(["trend", faster, "--baseline", *paths, "--fail-on-regression", "--splits", "0"]) == 0
    assert torchprof(["trend", slower, "--baseline", *paths, "--splits", "0"]) == 0
    assert "REGRESSION" in capsys.readouterr().out


@pytest.mark.slow
def test_fail_on_regression_passes_noise_and_fails_only_the_noise_checks_splits(tmp_path: Path) -> None:
    """Each of ten runs alike against the other nine passes the gate (exit 0), and over the noise
    check's random splits the gate fails exactly the splits the noise check counts (its figure is the
    gate's false-positive rate): at most 5 %, as the rule's own test asks."""
    alike, paths = _alike_runs(tmp_path, np.random.default_rng(4))
    for index, path in enumerate(paths):
        others = paths[:index] + paths[index + 1 :]
        assert torchprof(["trend", path, "--baseline", *others, "--fail-on-regression", "--splits", "0"]) == 0
    baseline = [_run(Path(p), p, r) for p, r in zip(paths, alike, strict=True)]
    doc = trend([_run(Path("new"), "new", alike[0])], baseline)
    assert doc["noise_check"]["splits"] == 200
    assert _gate_failures(alike, 200) == doc["noise_check"]["flagged"] <= 10


@pytest.mark.slow
def test_ci_gate_example_on_real_runs(tmp_path: Path, capsys) -> None:
    """The operations guide's CI step on real CPU runs: the noise-only run passes, the 3 % slower one
    exits 3 naming iteration-time after the whole --json report; each of the ten runs passes the gate
    against the other nine, and the gate fails none of the noise check's 500 random splits."""
    proc = run_doc_example("trend-ci-gate", tmp_path, timeout=600, TORCHPROF_LOG_LEVEL="WARNING")
    runs = sorted(str(p) for p in (tmp_path / "runs").glob("run*"))
    baseline = [read_input(p) for p in runs]
    levels = np.asarray([np.quantile(run.series["iteration-time"].samples, 0.25) for run in baseline])
    spread = (levels.max() - levels.min()) / np.median(levels) * 100
    gate = ["--fail-on-regression", "--splits", "0"]
    passed = sum(
        torchprof(["trend", path, "--baseline", *runs[:i], *runs[i + 1 :], *gate]) == 0
        for i, path in enumerate(runs)
    )
    check = trend([read_input(str(tmp_path / "runs" / "slower"))], baseline, splits=500)["noise_check"]
    failures = _gate_failures(baseline, 500)
    capsys.readouterr()
    with capsys.disabled():
        print(
            f"\ntrend gate: the ten runs' levels within {spread:.2f} %; {passed} of 10 pass against the "
            f"other nine; the gate fails {failures} of {check['splits']} random splits (noise check: "
            f"{check['flagged']}); the 3 % run: exit {proc.returncode}, {proc.stderr.strip()[-200:]}"
        )
    if spread > 1.5:  # the host's load shifted whole runs: they are not ten runs alike
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        pytest.skip(
            f"the ten runs' levels spread over {spread:.1f} % (load {load}): the machine shifted whole "
            "runs, so they are not alike; rerun on a quieter machine"
        )
    assert proc.returncode == ExitStatus.REGRESSION, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("torchprof trend: error: regression beyond the baseline runs' noise")
    assert "iteration-time +" in line and line.endswith("if the change is meant") and "in slower" in line
    doc = json.loads((tmp_path / "trend.json").read_text())
    assert [r["series"] for r in doc["regressions"]] == ["iteration-time"]
    assert passed == 10 and failures == check["flagged"] == 0
