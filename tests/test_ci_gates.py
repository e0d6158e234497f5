"""The CI gates' shared parts and ``torchprof diff --fail-above PCT``: exit status 3 (``REGRESSION``,
defined once) after the diff, naming the steps and operators that got slower, on real traces; a bad
PCT is argparse's one line; the guides' CI examples (a shell step run here, GitHub Actions steps
parsed with the real command line).  ``trend --fail-on-regression``: tests/test_trend.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from helpers.diagnose_traces import CPU_PAIR, straggler_pair
from helpers.examples import ci_workflow, run_doc_example
from helpers.paths import DATA

from torchprof_args.console import EXIT_STATUSES, build_parser
from torchprof_args.console import main as torchprof
from torchprof_args.errors import ExitStatus


def test_one_regression_status_for_both_gates() -> None:
    assert ExitStatus.REGRESSION == 3 and "  3    a CI gate failed" in EXIT_STATUSES
    for gate in ("trend --fail-on-regression", "diff --fail-above PCT"):
        assert gate in " ".join(EXIT_STATUSES.split())


def _diff_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    """``torchprof diff --json``'s status, its JSON and its one error line ("" without one; the other
    stderr lines say how many traces were parsed)."""
    status = torchprof(["diff", *argv, "--json", "--no-progress"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("torchprof diff: error: ")]
    assert len(errors) <= 1, captured.err
    return status, json.loads(captured.out), "".join(errors)


@pytest.mark.slow
def test_fail_above_fails_a_three_percent_slower_cycle_and_names_its_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real 2-rank DDP cycle, and the same cycle with rank 1 doing 3 % of a step more work each step
    (rank 0 waiting for it in its all-reduce): 3 % slower, by the diff's own step figures."""
    base = straggler_pair(tmp_path / "base", 0, pair=CPU_PAIR)[0].parent
    status, same, err = _diff_json(capsys, str(base), str(base), "--fail-above", "1")
    assert status == ExitStatus.OK and err == ""  # unchanged: nothing above 1 %
    step_us = same["base"]["step_mean_us"]
    slower = straggler_pair(tmp_path / "slower", 0.03 * step_us, pair=CPU_PAIR)[0].parent
    status, doc, err = _diff_json(capsys, str(base), str(slower), "--fail-above", "2")
    assert status == ExitStatus.REGRESSION == 3
    steps = {m["name"]: m["delta_pct"] for m in doc["metrics"] if m["name"].endswith("step")
             or m["name"].startswith("step time")}
    assert steps["step time (mean over ranks)"] == pytest.approx(3.0, abs=0.3)  # the whole --json diff
    assert err.startswith("torchprof diff: error: slower by more than 2 % (--fail-above): step time (mean "
                          "over ranks) +3.")
    assert "slowest rank's mean step +" in err and err.endswith("find why in the diff above")
    # above the gate's PCT: passes; the other way round (faster): passes
    assert _diff_json(capsys, str(base), str(slower), "--fail-above", "4")[0] == ExitStatus.OK
    assert _diff_json(capsys, str(slower), str(base), "--fail-above", "2")[0] == ExitStatus.OK


def test_fail_above_names_an_operator_that_costs_the_step_more_than_pct(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two ranks of one real job's steps: rank 1's gloo:all_reduce costs 7.5 % of rank 0's step more,
    and its step is 6.3 % longer; at 5 % both are named, steps first, each with its figure."""
    rank0, rank1 = (str(DATA / name) for name in CPU_PAIR)
    status, doc, err = _diff_json(capsys, rank0, rank1, "--fail-above", "5")
    assert status == ExitStatus.REGRESSION
    named = err.split("(--fail-above): ", 1)[1].split("; find why", 1)[0].split(", ")
    assert named[:2] == ["step time (mean over ranks) +6.3 %", "slowest rank's mean step +6.3 %"]
    assert named[2] == "operator gloo:all_reduce +7.5 % of the step"
    row = next(r for r in doc["operators"] if r["name"] == "gloo:all_reduce")
    assert 100 * row["delta_us"] / doc["base"]["step_mean_us"] == pytest.approx(7.5, abs=0.05)
    assert _diff_json(capsys, rank0, rank1, "--fail-above", "10")[0] == ExitStatus.OK


@pytest.mark.parametrize("value, message", [("abc", "expected a number > 0, got 'abc'"),
                                            ("-3", "must be > 0, got -3"), ("0", "must be > 0, got 0"),
                                            ("nan", "must be > 0, got nan")])
def test_a_bad_pct_is_argparses_one_line(capsys: pytest.CaptureFixture[str], value: str, message: str
                                          ) -> None:
    trace = str(DATA / CPU_PAIR[0])
    with pytest.raises(SystemExit) as usage:
        torchprof(["diff", trace, trace, "--fail-above", value])
    assert usage.value.code == ExitStatus.CANNOT_RUN
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"torchprof diff: error: argument --fail-above: {message}"
    assert err.startswith("usage: torchprof diff") and "Traceback" not in err


def test_fail_above_needs_steps_on_base(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(DATA / "gpu_1rank_alexnet.json.gz")  # a real trace without ProfilerStep#N
    assert torchprof(["diff", trace, trace, "--fail-above", "3", "--no-progress"]) == ExitStatus.CANNOT_RUN
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    last = captured.err.splitlines()[-1]
    assert last.startswith("torchprof diff: error: --fail-above needs BASE's step time")


@pytest.mark.slow
def test_diff_ci_gate_example(tmp_path: Path) -> None:
    """The trace toolkit guide's shell step: the two ranks of one job pass at 10 %, the 7 times slower
    cycle exits 3 naming its steps and operators, its whole diff in diff.json."""
    proc = run_doc_example("diff-ci-gate", tmp_path)
    assert proc.returncode == ExitStatus.REGRESSION, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert line.startswith("torchprof diff: error: slower by more than 10 % (--fail-above): step time "
                           "(mean over ranks) +643.9 %, slowest rank's mean step +643.9 %, operator "
                           "gloo:all_reduce")
    assert line.endswith("more; find why in the diff above")
    doc = json.loads((tmp_path / "diff.json").read_text())
    assert doc["metrics"][0]["delta_pct"] == pytest.approx(643.9, abs=0.05)


@pytest.mark.parametrize("name, command, gate", [("trend-github-actions", "trend", "fail_on_regression"),
                                                 ("diff-github-actions", "diff", "fail_above")])
def test_github_actions_steps_parse(name: str, command: str, gate: str) -> None:
    """The guides' GitHub Actions steps are YAML whose torchprof line the real parser accepts, with
    its gate on and its inputs where the command expects them."""
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(ci_workflow(name))
    steps = doc["jobs"]["trend"]["steps"] if "jobs" in doc else doc
    (line,) = [step["run"] for step in steps if str(step.get("run", "")).startswith("torchprof ")]
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert args.command == command and getattr(args, gate)
    if command == "trend":
        assert args.inputs == ["runs/new"] and args.baseline == ["$BASELINE/run*"]
    else:
        assert args.fail_above == 5 and args.new.startswith("prof/")
