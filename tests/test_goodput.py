"""The goodput ledger: runs marked in metrics.jsonl, each category computed, ``torchprof goodput``, and a
real 2-rank job with known costs (slow start, checkpoints, data, evaluation, a profiled window) killed
and restarted from its checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import REPO
from helpers.processes import kill_job, rank_results, run_torchrun, start_torchrun

from torchprof_args import MetricsWriter
from torchprof_args.capture.metrics.config import MetricsConfig
from torchprof_args.capture.metrics.goodput import CATEGORIES, build_ledger
from torchprof_args.capture.metrics.sinks import JsonlSink
from torchprof_args.console import main as torchprof
from torchprof_args.shared import formats
from torchprof_args.shared.metrics_log import RunMarker, read_records, read_runs

JOB = REPO / "tests" / "jobs" / "operations_job.py"


def _line(iteration: int, timestamp: float, **metrics: float) -> str:
    return json.dumps({"iteration": iteration, "timestamp": timestamp, "metrics": metrics})


def _marker(process_start: float, writer_start: float, start_iteration: int, run_id: str) -> str:
    return json.dumps(RunMarker(run_id, writer_start, start_iteration, process_start, 2, "h", 1).record())


def _two_runs(path: Path) -> Path:
    """A job killed after iteration 30 (last checkpoint 20), restarted from 20: hand-checked figures."""
    lines = [
        _marker(100.0, 110.0, 0, "a"),
        _line(
            10,
            120.0,
            **{
                "timers/save-checkpoint-time": 0.1,
                "timers/batch-generator-time": 0.05,
                "profiler/cost_seconds_total": 0.8,
                "profiler/flush_seconds_total": 0.3,
                "profiler/publishing_extra_seconds_total": 0.5,
            },
        ),
        _line(
            20,
            130.0,
            **{
                "timers/evaluate-time": 0.2,
                "profiler/cost_seconds_total": 1.0,
                "profiler/flush_seconds_total": 0.5,
                "profiler/publishing_extra_seconds_total": 0.5,
            },
        ),
        _line(30, 140.0, **{"timers/batch-generator-time": 0.22, "profiler/cost_seconds_total": 1.0}),
        json.dumps(
            {"iteration": 30, "timestamp": 175.0, "metrics": {}, "alive": {"id": "a"}}
        ),  # hung, killed
        _marker(180.0, 185.0, 20, "b"),
        _line(30, 195.0, **{"iteration-time": 1.0, "timers/load-checkpoint-time": 0.3}),
        _line(40, 205.0, **{"iteration-time": 1.0}),
        json.dumps({"iteration": 40, "timestamp": 207.0, "metrics": {}, "run_end": {"id": "b"}}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_ledger_of_a_killed_and_restarted_job(tmp_path: Path) -> None:
    ledger = build_ledger(read_runs(_two_runs(tmp_path / "metrics.jsonl")))
    lost = ledger.lost_s
    # startup: 10 s + (5 s less the 3 s checkpoint load timed before the writer started)
    assert lost["startup"] == pytest.approx(12.0)
    assert lost["checkpoint"] == pytest.approx(1.0 + 3.0)
    assert lost["data"] == pytest.approx(0.5 + 2.2) and lost["evaluation"] == pytest.approx(2.0)
    # the stalls as measured; the publisher's estimated 0.5 s only up to what its interval has left above
    # the undisturbed pace (0.78 s per step in the other two intervals): 0.4 s
    parts = {"flush": 0.5, "snapshot": 0.0, "recording": 0.0, "publishing": 0.4}
    assert ledger.profiling_s == pytest.approx(parts) and lost["profiling"] == pytest.approx(0.9)
    # 35 s alive after the last record: one usual interval (10 s) of unlogged steps, redone; 25 s hung
    assert lost["hang"] == pytest.approx(25.0)
    # iterations 21-30 redone (7.8 s productive) + those 10 s + 5 s between the runs
    assert lost["restart"] == pytest.approx(22.8)
    assert lost["other"] == pytest.approx(2.0)  # after the last record of the clean end
    assert ledger.productive_s == pytest.approx(7.8 + 7.8 + 10.0 + 10.0)
    assert ledger.wall_s == pytest.approx(107.0)
    assert ledger.productive_s + sum(lost.values()) == pytest.approx(ledger.wall_s)
    assert [r["closed"] for r in ledger.runs] == [False, True]


def test_a_rolling_window_prorates_the_pieces(tmp_path: Path) -> None:
    segments = read_runs(_two_runs(tmp_path / "metrics.jsonl"))
    ledger = build_ledger(segments[1:], since=190.0, now=210.0)
    # [190, 195] half of the first interval, [195, 205], [205, 207] other (closed: `now` is not used)
    assert ledger.wall_s == pytest.approx(17.0)
    assert ledger.productive_s == pytest.approx(15.0) and ledger.lost_s["other"] == pytest.approx(2.0)


def test_runs_are_marked_and_old_readers_still_read_the_file(tmp_path: Path) -> None:
    for start in (0, 2):
        writer = MetricsWriter(
            MetricsConfig(str(tmp_path), sinks=("jsonl",)),
            rank=0,
            world_size=1,
            start_iteration=start,
            console=False,
        )
        writer.log_step(start + 1)
        writer.log_step(start + 2)
        writer.close()
    segments = read_runs(tmp_path / "metrics.jsonl")
    assert [s.marker.start_iteration for s in segments] == [0, 2]
    assert all(s.end is not None and s.marker.process_start <= s.marker.writer_start for s in segments)
    assert [[r.iteration for r in s.records] for s in segments] == [[1, 2], [3, 4]]
    assert [r.iteration for r in read_records(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    # every line, markers included, is a record a reader without markers understands
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert isinstance(record["iteration"], int) and isinstance(record["metrics"], dict)


def test_a_run_of_a_newer_format_is_refused_in_one_line(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "metrics.jsonl"
    newer = RunMarker("r1", 10.0, 0, 9.0, 1, "h", 1).record()
    newer["run"]["version"] = formats.METRICS_RUN.version + 1
    path.write_text(json.dumps(newer) + "\n" + _line(2, 12.0, **{"iteration-time": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:1: .*newer than this torchprof-args reads"):
        read_runs(path)
    assert torchprof(["goodput", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "upgrade torchprof-args" in err[0] and "Traceback" not in err[0]


def test_records_are_typed_and_a_line_of_another_shape_is_named(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    bad = '{"iteration": "three", "timestamp": 13.0}'
    path.write_text(_line(2, 12.0, **{"iteration-time": 1}) + "\n" + bad + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a metrics record"):
        read_records(path)
    path.write_text(_line(2, 12.0, **{"iteration-time": 1}) + "\n")
    (record,) = read_records(path)
    assert record.iteration == 2 and record.metrics == {"iteration-time": 1.0} and record.per_rank == {}


def test_numpy_figures_are_written_and_read_back(tmp_path: Path) -> None:
    """Figures computed with numpy (float64, a float subclass) are written as before and read typed."""
    import numpy as np

    sink = JsonlSink(tmp_path / "metrics.jsonl", RunMarker.here(0, 2))
    sink.write(2, {"mfu": np.float64(0.25)}, {"gpu/sm-clock-mhz": [np.float64(1980.0), None]})
    sink.close()
    (record,) = read_records(tmp_path / "metrics.jsonl")
    assert record.metrics == {"mfu": 0.25} and record.per_rank == {"gpu/sm-clock-mhz": [1980.0, None]}


def test_a_silent_process_says_it_is_alive(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "metrics.jsonl", RunMarker.here(5, 1), alive_seconds=0.05)
    time.sleep(0.3)
    sink.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "run" in lines[0] and "run_end" in lines[-1]
    alive = [line for line in lines if "alive" in line]
    assert len(alive) >= 2 and all(line["iteration"] == 5 for line in alive)
    (segment,) = read_runs(tmp_path / "metrics.jsonl")
    assert segment.records == [] and segment.end == lines[-1]["timestamp"]


def test_lines_from_before_markers_form_one_run(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        _line(2, 10.0, **{"iteration-time": 1.0})
        + "\n"
        + _line(4, 12.0, **{"iteration-time": 1.0})
        + "\n"
        + '{"iteration": 6, "times'
    )  # a truncated last line
    (segment,) = read_runs(path)
    assert segment.marker is None and [r.iteration for r in segment.records] == [2, 4]
    ledger = build_ledger([segment])
    assert ledger.wall_s == pytest.approx(3.0) and ledger.productive_s == pytest.approx(3.0)
    assert ledger.notes


def test_goodput_command_text_json_and_extra_timer_names(tmp_path: Path, capsys) -> None:
    path = _two_runs(tmp_path / "metrics.jsonl")
    assert torchprof(["goodput", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "2 run(s), 1 restart(s)" in text and "goodput" in text
    for category in CATEGORIES:
        assert f"    {category} " in text
    assert torchprof(["goodput", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"version", "wall_s", "productive_s", "goodput", "lost_s"} <= set(doc) and doc["version"] == 1
    assert set(doc["lost_s"]) == set(CATEGORIES)
    assert doc["goodput"] == pytest.approx(doc["productive_s"] / doc["wall_s"])
    lines = path.read_text().splitlines()
    lines[3] = _line(30, 140.0, **{"timers/snapshot-save-time": 0.5, "profiler/cost_seconds_total": 0.6})
    path.write_text("\n".join(lines) + "\n")
    assert torchprof(["goodput", str(path), "--json", "--timer", "checkpoint=snapshot-save"]) == 0
    assert json.loads(capsys.readouterr().out)["lost_s"]["checkpoint"] == pytest.approx(4.0 + 5.0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["goodput", "{tmp}/missing"], "metrics.jsonl not found: point RUN_DIR at a run's --metrics-dir"),
        (["goodput", "{tmp}", "--timer", "nonsense"], "--timer 'nonsense': expected CATEGORY=NAME"),
    ],
)
def test_goodput_errors_are_one_line_and_exit_2(tmp_path: Path, capsys, argv, message) -> None:
    _two_runs(tmp_path / "metrics.jsonl")
    assert torchprof([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchprof goodput: error: ") and message in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# A real job


def _job(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--result-dir",
        str(tmp_path / "results"),
        "--metrics-dir",
        str(tmp_path / "metrics"),
        "--metrics-sinks",
        "jsonl",
        "--log-interval",
        "2",
        "--iters",
        "24",
        "--checkpoint",
        str(tmp_path / "ckpt.json"),
        "--checkpoint-every",
        "4",
        "--checkpoint-sleep",
        "0.4",
        "--data-sleep",
        "0.02",
        "--slow-rank-extra",
        "0",
        "--eval-every",
        "6",
        "--eval-sleep",
        "0.3",
        "--step-sleep",
        "0.02",
        "--progress",
        str(tmp_path / "progress.json"),
        "--torch-profile",
        "--torch-profile-dir",
        str(tmp_path / "prof"),
        "--torch-profile-skip-first",
        "1",
        "--torch-profile-warmup",
        "1",
        "--torch-profile-active",
        "2",
        "--torch-profile-repeat",
        "2",
        "--torch-profile-wait",
        "6",
        *extra,
    ]


def _progress(path: Path) -> int:
    try:
        return json.loads(path.read_text())["iteration"]
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_goodput_of_a_job_with_known_costs_killed_and_restarted(tmp_path: Path) -> None:
    # the first run: a slow start (4 s), killed by SIGKILL at iteration 14 or 15 (checkpoint at 12)
    first = start_torchrun(JOB, *_job(tmp_path, "--startup-sleep", "4"), cwd=tmp_path)
    deadline = time.monotonic() + 240
    while _progress(tmp_path / "progress.json") < 14:
        assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "torchrun.err").read_text()
        time.sleep(0.01)
    kill_job(first)
    killed_at = time.time()
    startup_first = json.loads((tmp_path / "results" / "startup_rank0.json").read_text())
    checkpoint = json.loads((tmp_path / "ckpt.json").read_text())
    assert checkpoint["iteration"] == 12
    time.sleep(2.0)  # the scheduler's delay before the restart
    # the restart: resumes from iteration 12, loads its checkpoint (0.5 s), runs to 24
    second = run_torchrun(JOB, *_job(tmp_path, "--resume", "--load-sleep", "0.5"), cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    startup_second = json.loads((tmp_path / "results" / "startup_rank0.json").read_text())
    segments = read_runs(tmp_path / "metrics" / "metrics.jsonl")
    assert [s.marker.start_iteration for s in segments] == [0, 12] and segments[0].end is None
    ledger = build_ledger(segments)
    lost = ledger.lost_s
    logged = [[r.iteration for r in s.records] for s in segments]

    # start-up: the 4 s slept, over what each process took to get there without it (the second one's
    # includes its 0.5 s checkpoint load, which the ledger counts as checkpoint time)
    base = sum(s["before_sleep"] - s["process_start"] for s in (startup_first, startup_second)) - 0.5
    assert lost["startup"] - base == pytest.approx(4.0, rel=0.1)
    # checkpoints: 0.4 s per save in the logged intervals (4, 8, 12 in the first run; 16, 20, 24), 0.5 s load
    saves = sum(1 for run in logged for it in run if it % 4 == 0)
    assert lost["checkpoint"] == pytest.approx(0.4 * saves + 0.5, rel=0.1)
    steps = sum(len(run) * 2 for run in logged)
    # 0.02 s sleeps, the shortest cost: what they overshoot (two ranks on two busy cores, the slower
    # rank's per interval, the first step's lazy set-up) is a larger share of them, and never negative
    assert 0.02 * steps <= lost["data"] <= 0.02 * steps * 1.3, (lost["data"], steps)
    evals = sum(1 for run in logged for it in run if it % 6 == 0)
    assert lost["evaluation"] == pytest.approx(0.3 * evals, rel=0.1)
    # the restart: from the end of checkpoint 12 to the second process's start, less what the logged
    # intervals after it lost to the other categories (data, evaluation: known)
    after = [it for it in logged[0] if it > 12]
    other_losses = 0.02 * 2 * len(after) + 0.3 * sum(1 for it in after if it % 6 == 0)
    expected = segments[1].marker.process_start - checkpoint["saved_at"] - other_losses
    assert segments[1].marker.process_start - killed_at < expected  # the restart delay is in it
    assert lost["restart"] == pytest.approx(expected, rel=0.1)
    assert lost["hang"] == pytest.approx(0.0, abs=0.05)
    # profiling: the flush stalls the runtime measured, all of them; its estimates of the slowdown of the
    # recorded steps and of the steps beside the publisher only as far as the timers leave room
    final = [s.records[-1].metrics for s in segments]
    assert ledger.profiling_s["flush"] == pytest.approx(sum(m["profiler/flush_seconds_total"] for m in final))
    assert ledger.profiling_s["flush"] > 0
    assert (
        ledger.profiling_s["flush"]
        <= lost["profiling"]
        <= sum(m["profiler/cost_seconds_total"] for m in final)
    )
    assert rank_results(tmp_path / "results")[0]["start"] == 12


@pytest.mark.slow
def test_operations_guide_goodput_example(tmp_path: Path) -> None:
    """The guide's example, verbatim: a run that starts slowly and checkpoints, then a restart from its
    last checkpoint; the ledger's checkpoint and evaluation time are the job's sleeps."""
    proc = run_doc_example("operations-goodput", tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "goodput of run/metrics.jsonl: 2 run(s), 1 restart(s)" in proc.stdout
    segments = read_runs(tmp_path / "run" / "metrics.jsonl")
    assert [s.marker.start_iteration for s in segments] == [0, 24] and all(s.end for s in segments)
    lost = build_ledger(segments).lost_s
    assert lost["checkpoint"] == pytest.approx(
        7 * 1.0 + 1.0, rel=0.1
    )  # saves at 8, 16, 24, 32, ..., 56; the load
    assert lost["evaluation"] == pytest.approx(3 * 0.5, rel=0.1)  # at 20, then 40 and 60 after the restart
    assert lost["restart"] > 0 and lost["startup"] > 3.0
