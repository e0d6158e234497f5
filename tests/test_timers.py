"""torchprof_args.Timers: Megatron semantics on CPU, the CUDA-event bookkeeping, flags, rank mismatch."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.paths import REPO
from helpers.processes import rank_results, run_torchrun

from torchprof_args import Timers, add_torch_profile_args, validate_args
from torchprof_args.capture.metrics.timer_kinds import CudaEventTimer as _CudaEventTimer
from torchprof_args.capture.metrics.timer_kinds import DummyTimer
from torchprof_args.capture.metrics.timer_kinds import EventPool as _EventPool
from torchprof_args.capture.metrics.timer_kinds import SynchronizingTimer as _SynchronizingTimer
from torchprof_args.capture.metrics.timer_kinds import Timer as _Timer
from torchprof_args.capture.metrics.timers import TimerSnapshot, format_snapshot
from torchprof_args.errors import TimerError


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_start_stop_accumulates_and_elapsed_resets() -> None:
    timers = Timers(0, "minmax", device="cpu")  # host timing of host work (tests/gpu covers CUDA events)
    assert timers.device == "cpu"
    timer = timers("step", log_level=0)
    for _ in range(3):
        timer.start()
        _spin(0.002)
        timer.stop()
    first = timer.elapsed(reset=False)
    assert 0.006 <= first < 0.5
    assert timer.elapsed(reset=True) == first
    assert timer.elapsed() == 0.0
    assert timer.active_time() >= first  # active time survives resets, as in Megatron


def test_elapsed_of_a_running_timer_keeps_it_running() -> None:
    timer = Timers(0, "max")("running", log_level=0)
    timer.start()
    _spin(0.002)
    assert timer.elapsed() >= 0.002
    _spin(0.002)
    timer.stop()
    assert timer.elapsed() >= 0.002


def test_misuse_is_a_clear_error_that_is_also_an_assertion_error() -> None:
    timer = Timers(0, "max")("t", log_level=0)
    with pytest.raises(TimerError, match="is not started"):
        timer.stop()
    timer.start()
    with pytest.raises(AssertionError, match="already been started"):
        timer.start()


def test_log_levels_and_dummy_timers() -> None:
    timers = Timers(1, "minmax")
    assert isinstance(timers("level-2"), DummyTimer)  # no level given means the max level, 2
    assert isinstance(timers("level-2b", log_level=2), DummyTimer)
    measured = timers("level-1", log_level=1)
    assert not isinstance(measured, DummyTimer)
    dummy = timers("level-2")
    dummy.start()
    dummy.stop()
    with pytest.raises(TimerError, match="log level"):
        dummy.elapsed()
    with pytest.raises(TimerError, match="created with log level 1"):
        timers("level-1", log_level=0)
    with pytest.raises(TimerError, match="outside 0..2"):
        timers("bad", log_level=3)
    assert timers.names() == ["level-1"]
    with pytest.raises(ValueError, match="log_option"):
        Timers(0, "mean")


def test_log_text_for_each_option_in_milliseconds() -> None:
    snapshot = TimerSnapshot(["fwd", "opt"], [[0.010, math.nan], [0.030, 0.002]], [None, None])
    assert snapshot.min_max() == {"fwd": (0.010, 0.030), "opt": (0.002, 0.002)}
    text = format_snapshot(snapshot, "minmax", normalizer=2.0)
    assert text.splitlines()[0] == "(min, max) time across ranks (ms):"
    assert "fwd " in text and "(5.00, 15.00)" in text
    assert "15.00" in format_snapshot(snapshot, "max", normalizer=2.0)
    all_text = format_snapshot(snapshot, "all")
    assert "rank  1: 30.00" in all_text and "rank  0: 2.00" not in all_text  # NaN ranks left out
    assert format_snapshot(TimerSnapshot(["x"], [[math.nan]], [None]), "max") is None


def test_single_process_log_and_write_to_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    timers = Timers(0, "minmax")
    for _ in range(4):
        timers("forward", log_level=0).start()
        _spin(0.001)
        timers("forward").stop()
    timers("never-run", log_level=0)
    text = timers.log(["forward", "never-run"], normalizer=4, reset=False)
    assert text is not None and "forward" in text and "never-run" not in text
    writer = SummaryWriter(str(tmp_path))
    written = timers.write(["forward", "never-run"], writer, 7, normalizer=4)
    writer.close()
    assert set(written) == {"timers/forward-time", "timers/forward-time-min"}
    assert 0.001 <= written["timers/forward-time"] < 0.1
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    scalars = events.Scalars("timers/forward-time")
    assert [s.step for s in scalars] == [7]
    assert scalars[0].value == pytest.approx(written["timers/forward-time"], rel=1e-5)
    assert timers("forward").elapsed() == 0.0  # write reset it


def test_write_with_max_option_writes_only_the_max() -> None:
    timers = Timers(0, "max")
    timers("a", log_level=0).start()
    timers("a").stop()
    assert list(timers.write(["a"], None, 1)) == ["timers/a-time"]
    with pytest.raises(TypeError, match="add_scalar"):
        timers("a").start()
        timers("a").stop()
        timers.write(["a"], object(), 1)


class _HostEvent:
    """Stand-in for ``torch.cuda.Event`` backed by the host clock (no GPU on CI): it exercises
    the event timer's pairing, lazy resolution and pooling; the CUDA calls themselves are the
    documented ``record``/``query``/``synchronize``/``elapsed_time``."""

    created = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        type(self).created += 1
        self.time: float | None = None

    def record(self) -> None:
        self.time = time.perf_counter()

    def query(self) -> bool:
        return self.time is not None

    def synchronize(self) -> None:
        assert self.time is not None

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.time - self.time) * 1000.0


class _HostCuda:
    class cuda:  # noqa: N801  (mirrors torch.cuda)
        Event = _HostEvent


@pytest.mark.parametrize("kind", ["host", "synchronizing", "cuda events"])
def test_start_and_stop_with_a_barrier(kind: str) -> None:
    """Megatron's ``start(barrier=...)``/``stop(barrier=...)`` (``--barrier-with-L1-time``): the flag
    once shadowed the barrier function (``'bool' object is not callable``); alone, nobody to wait for."""
    synchronized: list[str] = []
    timer = {"host": lambda: _Timer("fwd"),
             "synchronizing": lambda: _SynchronizingTimer("fwd", lambda: synchronized.append("sync")),
             "cuda events": lambda: _CudaEventTimer("fwd", _EventPool(_HostCuda))}[kind]()
    timer.start(barrier=True)
    _spin(0.001)
    timer.stop(barrier=True)
    assert timer.elapsed(barrier=True) >= 0.001
    assert synchronized == (["sync", "sync"] if kind == "synchronizing" else [])


def test_cuda_event_timer_bookkeeping_resolves_lazily_and_reuses_events() -> None:
    _HostEvent.created = 0
    timer = _CudaEventTimer("fwd", _EventPool(_HostCuda))
    for _ in range(3):
        timer.start()
        _spin(0.001)
        timer.stop()
    assert len(timer._pending) == 3 and timer._elapsed == 0.0  # nothing resolved at stop
    seconds = timer.elapsed()
    assert 0.003 <= seconds < 0.5 and timer._pending == []
    for _ in range(3):
        timer.start()
        timer.stop()
    assert _HostEvent.created == 6  # the second round reused the pooled events
    for _ in range(300):  # past the pending cap, completed pairs are folded in without blocking
        timer.start()
        timer.stop()
    assert len(timer._pending) < 256
    assert timer.active_time() >= seconds
    timer.start()
    running = timer.elapsed()
    assert running >= 0.0 and timer._started


def test_timers_device_auto_is_cpu_without_cuda() -> None:
    import torch

    timers = Timers(0, "minmax", device="cuda")
    assert timers.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert Timers(0, "minmax", device="cpu").device == "cpu"


def test_from_args_reads_the_flags(tmp_path: Path) -> None:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = validate_args(
        parser.parse_args(
            ["--timing-log-level", "2", "--timing-log-option", "all", "--timing-synchronize",
             "--metrics-dir", str(tmp_path)]
        ),
        world_size=1,
    )
    timers = Timers.from_args(args)
    assert (timers.log_level, timers.log_option, timers.synchronize) == (2, "all", True)
    defaults = Timers.from_args(parser.parse_args([]))
    assert (defaults.log_level, defaults.log_option, defaults.synchronize) == (0, "minmax", False)


def test_bad_timing_flags_fail_in_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--timing-log-level", "3"])
    assert exit_info.value.code == 2
    assert "--timing-log-level: must be 0, 1 or 2" in capsys.readouterr().err


def test_straggler_flags(capsys: pytest.CaptureFixture[str]) -> None:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    timers = Timers.from_args(parser.parse_args(["--straggler-threshold", "1.5", "--straggler-intervals", "5",
                                                 "--straggler-timers", "fwd", "opt"]))
    assert (timers.stragglers.threshold, timers.stragglers.intervals, timers._straggler_timers) == (
        1.5, 5, ("fwd", "opt"))
    assert Timers.from_args(parser.parse_args(["--straggler-threshold", "0"])).stragglers.threshold == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["--straggler-threshold", "0.9"])
    assert ("--straggler-threshold: must be above 1 (times the other ranks' median), or 0"
            in capsys.readouterr().err)


def test_megatron_host_options_are_reused_not_redefined() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-interval", type=int, default=100)
    parser.add_argument("--timing-log-level", type=int, default=0, choices=range(0, 3))
    parser.add_argument("--timing-log-option", default="minmax", choices=["max", "minmax", "all"])
    parser.add_argument("--wandb-project", default="")
    parser.add_argument("--wandb-exp-name", default="")
    parser.add_argument("--wandb-save-dir", default="")
    add_torch_profile_args(parser)  # would raise argparse.ArgumentError on a clash
    args = parser.parse_args(["--log-interval", "5", "--wandb-mode", "offline"])
    assert args.log_interval == 5 and args.wandb_project == "" and args.wandb_mode == "offline"


def _torchrun(script_args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(tmp_path),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
        HOME=str(tmp_path / "home"),
        OMP_NUM_THREADS="1",
        TMPDIR=str(tmp_path / "tmp"),  # torchrun's torchelastic_* logs and wandb's scratch stay here
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.pop("WANDB_API_KEY", None)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(REPO / "tests" / "timers_train_script.py"), *script_args,
    ]
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_two_ranks_with_different_names_get_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    result = _torchrun(["--mismatch", "--metrics-dir", str(tmp_path / "run")], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in (0, 1):
        # Both ranks write to one pipe: find each rank's message wherever it landed.
        match = re.search(rf"MISMATCH rank {rank}: ([^\n]*?)(?=MISMATCH rank|\n|$)", output)
        assert match, f"no mismatch error reported by rank {rank}:\n{output[-4000:]}"
        assert "same timer names on every rank" in match.group(1)
        assert "rank 1 has extra ['optimizer']" in match.group(1)


@pytest.mark.slow
def test_fixed_size_gather_on_two_ranks_agrees_once_and_names_the_straggler(tmp_path: Path) -> None:
    """One tensor all-gather per interval after a one-time agreement; a new layout re-agrees on
    every rank; a later mismatch is the clear error on both ranks; rank 1 (slow forward-backward)
    is the slowest rank, has the top score and is named by rank 0's warning."""
    result = run_torchrun(REPO / "tests" / "timers_train_script.py", "--gather-check", str(tmp_path),
                          "--straggler-intervals", "2", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = rank_results(tmp_path)
    assert sorted(ranks) == [0, 1]
    for rank, entry in ranks.items():
        counts = [interval["collectives"] for interval in entry["intervals"]]
        # agreement (object all-gather = 2 collectives) + gather; then 1; a new figure key (5) or a new
        # timer on one rank (6): 1 + 2 + 1; back to the first layout (7): 1 again
        assert counts == [3, 1, 1, 1, 4, 4, 1], (rank, counts)
        first, union_new_key, new_timer = entry["intervals"][0], entry["intervals"][4], entry["intervals"][5]
        assert first["names"] == ["forward-backward", "optimizer"] and first["global_ranks"] == [0, 1]
        assert first["per_rank"] == [{"memory/x": 0.0}, {"memory/x": 1.0}]
        assert union_new_key["per_rank"] == [{"memory/x": 0.0, "profiler/y": 1.0}, {"memory/x": 1.0}]
        assert new_timer["names"] == ["forward-backward", "optimizer", "eval"]
        # rank 0 never ran "eval"
        assert math.isnan(new_timer["times"][0][2]) and new_timer["times"][1][2] > 0
        for interval in entry["intervals"]:
            fwd0, fwd1 = (row[0] for row in interval["times"])
            assert fwd1 > fwd0
            assert interval["scalars"]["timers/forward-backward-time-max-rank"] == 1.0
            assert interval["scalars"]["stragglers/forward-backward-score-max-rank"] == 1.0
            # each rank's time / the other rank's (1 ms and 4 ms)
            assert interval["scores"]["stragglers/forward-backward-score"] == pytest.approx([0.25, 4.0])
        assert "same timer names on every rank" in entry["mismatch"]
        assert "rank 1 has extra ['optimizer']" in entry["mismatch"]
        # streak of 2 intervals -> warned at 2, then at 4 (doubling); every rank agrees on them
        assert entry["warnings"] == [
            "straggler: rank 1 forward-backward took 4.00x the median of the other ranks (4.0 ms vs "
            f"1.0 ms; 2 ranks) for {n} log intervals in a row (iterations 1-{n}; --straggler-threshold 1.05)"
            for n in (2, 4)]
    warned = ("WARNING torchprof_args.capture.metrics.straggler_tracker: [torchprof rank {}] straggler: "
              "rank 1 forward-backward")
    assert warned.format(0) in result.stderr
    assert warned.format(1) not in result.stderr  # rank 0 only


@pytest.mark.slow
def test_gather_carries_megatron_parallel_coordinates(tmp_path: Path) -> None:
    """With megatron-core's parallel state up, the one-time agreement carries each rank's
    coordinates (the straggler warning names them); without it, none."""
    pytest.importorskip("megatron.core")
    script = f"""
import json, torch.distributed as dist
from torchprof_args import Timers
dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
timers = Timers(0, "minmax")
timers("fwd", log_level=0).start(); timers("fwd").stop()
before = timers.gather(["fwd"]).coordinates
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
timers("fwd").start(); timers("fwd").stop()
print(json.dumps([before, timers.gather(["fwd"]).coordinates]))
parallel_state.destroy_model_parallel(); dist.destroy_process_group()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == [None] and after == [{"dp": 0, "tp": 0, "pp": 0, "cp": 0, "ep": 0}]


def test_straggler_figures_and_warning_on_one_process() -> None:
    """Scores are time over the median of the other ranks; no score for timers fewer than two ranks
    ran; a straggler is also 2 ms over that median."""
    from torchprof_args.capture.metrics.straggler_tracker import StragglerTracker, straggler_figures

    names = ["forward-backward", "data"]
    times = [[0.10, 0.01], [0.10, math.nan], [0.25, math.nan], [0.12, math.nan]]
    scalars, per_rank = straggler_figures(names, times, [8, 9, 10, 11], scored=["forward-backward"])
    assert scalars == {"timers/forward-backward-time-max-rank": 10.0,
                       "stragglers/forward-backward-score-max": pytest.approx(0.25 / 0.10),
                       "stragglers/forward-backward-score-max-rank": 10.0}
    assert per_rank["stragglers/forward-backward-score"] == pytest.approx([0.1 / 0.12, 0.1 / 0.12, 2.5, 1.2])
    tracker = StragglerTracker(1.5, 2, rank=1)  # not rank 0: computes, does not log
    coords = [None, None, {"dp": 1, "tp": 0, "pp": 1, "cp": 0, "ep": 0}, None]
    assert tracker.update(100, names, times, per_rank, [8, 9, 10, 11], coords) == []
    assert tracker.update(100, names, times, per_rank, [8, 9, 10, 11], coords) == []  # same interval twice
    (warning,) = tracker.update(200, names, times, per_rank, [8, 9, 10, 11], coords)
    assert warning.startswith("straggler: rank 10 (dp=1 tp=0 pp=1 cp=0 ep=0) forward-backward took 2.50x the "
                              "median of the other ranks (250.0 ms vs 100.0 ms; 4 ranks) for 2 log "
                              "intervals in a row (iterations 100-200")
    assert StragglerTracker(0, 2, rank=0).update(1, names, times, per_rank, [8, 9, 10, 11]) == []


def test_timers_are_nvtx_ranges_with_nsys():
    """--torch-profile-nsys: each timer start/stop is an NVTX range (stand-in NVTX: no CUDA here)."""
    from test_nsys import CallLog

    nvtx = CallLog()
    timers = Timers(0, "minmax", device="cpu", nvtx=nvtx)
    timers("forward-backward", log_level=0).start()
    timers("forward-backward").stop()
    timers("detail", log_level=2).start()  # a dummy timer above the log level: no range
    assert nvtx.calls == ["push forward-backward", "pop"]
    assert timers("forward-backward").elapsed() >= 0.0
