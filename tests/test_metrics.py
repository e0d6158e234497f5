"""MetricsWriter: a real 2-rank gloo run read back from wandb (offline), TensorBoard and metrics.jsonl."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO

from torchprof_args import MetricsWriter, Timers, TorchProfileArgsError, add_torch_profile_args, validate_args
from torchprof_args.capture.metrics.config import (
    MetricsConfig,
    WandbConfig,
    default_wandb_mode,
    wandb_credentials_present,
)
from torchprof_args.capture.metrics.flops import transformer_flops_per_iteration
from torchprof_args.shared.metrics_log import read_records

TIMER_NAMES = ("batch-generator", "forward-backward", "optimizer")


def offline_config(metrics_dir) -> MetricsConfig:
    return MetricsConfig(str(metrics_dir), wandb=WandbConfig(mode="offline"))


@pytest.fixture(autouse=True)
def _offline(offline_wandb: None) -> None:
    """Every test here runs real wandb offline (conftest.offline_wandb)."""


def _child_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _read_wandb_history(run_dir: Path) -> list[dict]:
    """History rows of the offline run, read by wandb's own reader (`wandb leet inspect`)."""
    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"expected one offline run under {run_dir}, found {files}"
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(files[0])],
        capture_output=True, text=True, timeout=120, check=True,
    )
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    metric_defs = [r["metric"] for r in records if r.get("type") == "metric"]
    assert {"glob_name": "*", "options": {"defined": True, "step_sync": True},
            "step_metric": "iteration"} in metric_defs
    return [r["history"]["item"] for r in records if r.get("type") == "history"]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real torchrun --nproc_per_node 2 (gloo) training run; returns its metrics dir."""
    base = tmp_path_factory.mktemp("two_rank")
    env = _child_env(base)
    env.update(
        WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(base), HOME=str(base / "home"),
        WANDB_CONFIG_DIR=str(base / "wandb-config"), WANDB_CACHE_DIR=str(base / "wandb-cache"),
        WANDB_DATA_DIR=str(base / "wandb-data"), TMPDIR=str(base / "tmp"),  # torchelastic_* logs, wandb's
    )
    (base / "tmp").mkdir()
    env.pop("WANDB_API_KEY", None)
    run_dir = base / "run"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(REPO / "tests" / "timers_train_script.py"),
        "--metrics-dir", str(run_dir), "--log-interval", "2", "--train-iters", "8",
        "--wandb-project", "torchprof-test", "--wandb-exp-name", "two-ranks",
    ]
    result = subprocess.run(command, env=env, cwd=base, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout
    return run_dir


@pytest.mark.slow
def test_metrics_jsonl_has_every_interval_with_min_le_max(two_rank_run: Path) -> None:
    records = read_records(two_rank_run / "metrics.jsonl")
    assert [r.iteration for r in records] == [2, 4, 6, 8]
    for record in records:
        metrics = record.metrics
        for name in TIMER_NAMES:
            assert 0 < metrics[f"timers/{name}-time-min"] <= metrics[f"timers/{name}-time"], name
        assert "timers/not-logged-time" not in metrics  # level 2 timer above --timing-log-level 0
        assert metrics["throughput/samples-per-sec"] == pytest.approx(32 / metrics["iteration-time"])
        assert metrics["throughput/tokens-per-sec"] == pytest.approx(32 * 32 / metrics["iteration-time"])
        assert metrics["throughput"] > 0
        assert metrics["memory/host-max-rss-gb"] > 0
        assert metrics["profiler/trace_mb"] == 2.5 and metrics["profiler/trace_mb-min"] == 1.5
        per_rank = record.per_rank
        assert per_rank["profiler/trace_mb"] == [1.5, 2.5]
        assert len(per_rank["timers/forward-backward-time"]) == 2
        # rank 1 sleeps 10 ms longer in batch-generator: the max is rank 1's value
        rank0, rank1 = per_rank["timers/batch-generator-time"]
        assert rank0 < rank1 and metrics["timers/batch-generator-time"] == rank1
        assert metrics["timers/batch-generator-time-min"] == rank0
        for name in ("forward-backward",):
            values = per_rank[f"timers/{name}-time"]
            assert (metrics[f"timers/{name}-time-min"], metrics[f"timers/{name}-time"]) == (
                min(values), max(values))
    flush = [r.metrics["profiler/flush_seconds"] for r in records]
    assert flush == sorted(flush) and flush[-1] == pytest.approx(0.16)


@pytest.mark.slow
def test_slowest_rank_and_straggler_scores_in_metrics_and_heatmap(two_rank_run: Path) -> None:
    """timers/<name>-time-max-rank names the slow rank; the scored timers' per-rank scores (time
    over the other ranks' median) are in metrics.jsonl and drawn as the dashboard's rank x interval
    heatmap."""
    from torchprof_args.console import main as torchprof

    for record in read_records(two_rank_run / "metrics.jsonl"):
        metrics, per_rank = record.metrics, record.per_rank
        times = per_rank["timers/batch-generator-time"]  # rank 1 sleeps 10 ms longer there (as a rule)
        assert metrics["timers/batch-generator-time-max-rank"] == float(times.index(max(times)))
        # optimizer goes through Megatron-style timers.write: its scalars, but no per-rank series
        assert (metrics["stragglers/optimizer-score-max"] >= 1.0
                and "stragglers/optimizer-score" not in per_rank)
        for name in ("forward-backward",):  # a default --straggler-timers timer, logged by log_step
            scores = per_rank[f"stragglers/{name}-score"]
            times = per_rank[f"timers/{name}-time"]
            assert scores == pytest.approx([times[0] / times[1], times[1] / times[0]])  # the other rank
            assert metrics[f"stragglers/{name}-score-max"] == pytest.approx(max(scores))
            assert metrics[f"stragglers/{name}-score-max-rank"] == float(scores.index(max(scores)))
            assert metrics[f"timers/{name}-time-max-rank"] == float(times.index(max(times)))
        assert "stragglers/batch-generator-score" not in per_rank  # not a --straggler-timers timer
    output = two_rank_run / "timings.html"
    assert torchprof(["dashboard", str(two_rank_run), "-o", str(output)]) == 0
    page = output.read_text()
    # one heatmap: forward-backward (optimizer has no per-rank series)
    assert page.count('<svg class="panel heatmap"') == 1
    assert page.count("<title>rank ") == 2 * 4  # 2 ranks x 4 intervals
    assert "rank 1, iteration 8:" in page and "(white: the other ranks' median)" in page


@pytest.mark.slow
def test_tensorboard_events_hold_the_same_series(two_rank_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(two_rank_run), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in TIMER_NAMES:
        assert {f"timers/{name}-time", f"timers/{name}-time-min"} <= tags
    assert {"iteration-time", "throughput/samples-per-sec", "profiler/flush_seconds"} <= tags
    jsonl = {r.iteration: r.metrics for r in read_records(two_rank_run / "metrics.jsonl")}
    for name in TIMER_NAMES:
        highs = events.Scalars(f"timers/{name}-time")
        lows = events.Scalars(f"timers/{name}-time-min")
        assert [s.step for s in highs] == [2, 4, 6, 8]
        for high, low in zip(highs, lows, strict=True):
            assert low.value <= high.value
            assert high.value == pytest.approx(jsonl[high.step][f"timers/{name}-time"], rel=1e-5)


@pytest.mark.slow
def test_wandb_offline_run_holds_the_same_series(two_rank_run: Path) -> None:
    history = _read_wandb_history(two_rank_run)
    assert [row["iteration"] for row in history] == [2, 4, 6, 8]
    jsonl = {r.iteration: r.metrics for r in read_records(two_rank_run / "metrics.jsonl")}
    for row in history:
        for name in TIMER_NAMES:
            assert row[f"timers/{name}-time-min"] <= row[f"timers/{name}-time"]
            assert row[f"timers/{name}-time"] == pytest.approx(jsonl[row["iteration"]][f"timers/{name}-time"])
        assert row["iteration-time"] > 0
    run_info = json.loads((two_rank_run / "wandb_run.json").read_text())
    assert run_info["project"] == "torchprof-test" and run_info["name"] == "two-ranks"
    assert run_info["mode"] == "offline"


@pytest.mark.slow
def test_wandb_failing_mid_run_warns_once_and_other_sinks_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import wandb

    timers = Timers(0, "minmax")
    writer = MetricsWriter(offline_config(tmp_path / "run"), timers=timers, rank=0, world_size=1)
    assert writer.sink_names == ["metrics.jsonl", "TensorBoard", "wandb"]
    timers("step", log_level=0).start()
    timers("step").stop()
    writer.log_step(1)
    wandb.run.finish()  # wandb's run dies behind the writer's back
    for iteration in (2, 3, 4):
        timers("step").start()
        timers("step").stop()
        writer.log_step(iteration)
    writer.close()
    assert writer.sink_names == []
    assert caplog.text.count("wandb metrics stopped") == 1
    assert "wandb metrics stopped at iteration 2" in caplog.text
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [r.iteration for r in records] == [1, 2, 3, 4]
    assert all("timers/step-time" in r.metrics for r in records)


def test_wandb_not_installed_warns_and_the_rest_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb looks like
    writer = MetricsWriter(offline_config(tmp_path / "run"), rank=0, world_size=1, console=False)
    assert writer.sink_names == ["metrics.jsonl", "TensorBoard"]
    writer.log_step(1, iteration_time=0.5, samples=4)
    writer.close()
    assert "wandb metrics are off" in caplog.text
    (record,) = read_records(tmp_path / "run" / "metrics.jsonl")
    assert record.metrics["throughput/samples-per-sec"] == 8.0


def test_add_scalar_and_log_buffer_per_iteration(tmp_path: Path) -> None:
    writer = MetricsWriter(MetricsConfig(str(tmp_path), sinks=("jsonl",)), rank=0, world_size=1,
                           console=False)
    writer.add_scalar("a", 1.0, 10)
    writer.log({"b": 2.0}, step=10)
    writer.add_scalar("a", 3.0, 20)  # a new iteration flushes the previous one
    writer.log_step(20, iteration_time=1.0)
    writer.close()
    records = read_records(tmp_path / "metrics.jsonl")
    assert records[0].metrics == {"a": 1.0, "b": 2.0}
    assert records[1].metrics["a"] == 3.0 and records[1].metrics["iteration-time"] == 1.0


def test_non_writing_rank_has_no_sinks(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "run", rank=0, world_size=4)
    assert writer.metrics_rank == 3 and not writer.is_writer and writer.sink_names == []
    writer.add_scalar("a", 1.0, 1)
    writer.close()
    assert not (tmp_path / "run").exists()


def test_from_args_uses_flags_and_megatron_names(tmp_path: Path) -> None:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args(
        ["--tensorboard-dir", str(tmp_path / "tb"), "--metrics-sinks", "jsonl",
         "--metrics-flops-per-iteration", "4e12"]
    )
    args.global_batch_size, args.seq_length = 8, 128  # what Megatron-LM's namespace carries
    writer = MetricsWriter.from_args(args, rank=1, world_size=2, console=False)
    assert writer.metrics_dir == tmp_path / "tb" and writer.sink_names == ["metrics.jsonl"]
    assert (writer.config.samples_per_iteration, writer.config.tokens_per_iteration) == (8, 1024)
    metrics = writer.log_step(1, iteration_time=2.0)
    writer.close()
    assert metrics["throughput"] == pytest.approx(1.0)  # 4e12 / 2 s / 2 GPUs
    assert metrics["throughput/tokens-per-sec"] == 512


def test_validation_errors_name_the_flags(tmp_path: Path) -> None:
    parser = add_torch_profile_args(argparse.ArgumentParser())
    with pytest.raises(TorchProfileArgsError, match="--metrics-rank 4 is outside the world size 4"):
        validate_args(parser.parse_args(["--metrics-rank", "4"]), world_size=4)
    with pytest.raises(TorchProfileArgsError, match="--wandb-mode online needs wandb credentials"):
        validate_args(parser.parse_args(["--wandb-mode", "online"]), world_size=1)
    with pytest.raises(TorchProfileArgsError, match="needs 'wandb' in --metrics-sinks"):
        validate_args(parser.parse_args(["--wandb-mode", "offline", "--metrics-sinks", "jsonl"]),
                      world_size=1)
    validate_args(parser.parse_args(["--metrics-rank", "3", "--wandb-mode", "disabled"]), world_size=4)


def test_wandb_mode_default_follows_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE")
    assert not wandb_credentials_present() and default_wandb_mode() == "offline"
    netrc_file = tmp_path / "home" / ".netrc"
    netrc_file.parent.mkdir(parents=True, exist_ok=True)
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password not-a-real-key\n")
    netrc_file.chmod(0o600)
    assert wandb_credentials_present() and default_wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert default_wandb_mode() == "offline"


def test_transformer_flops_match_the_closed_form() -> None:
    # GPT-3 style (no GQA, ffn = 4h): 72 * B * s * L * h^2 * (1 + s/(6h) + V/(12 L h))
    batch, seq, layers, hidden, vocab = 512, 2048, 24, 2048, 51200
    expected = (72 * batch * seq * layers * hidden**2
                * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden)))
    got = transformer_flops_per_iteration(
        num_layers=layers, hidden_size=hidden, seq_length=seq, vocab_size=vocab, global_batch_size=batch,
        num_attention_heads=16,
    )
    assert got == pytest.approx(expected, rel=1e-12)
    gqa = transformer_flops_per_iteration(
        num_layers=layers, hidden_size=hidden, seq_length=seq, vocab_size=vocab, global_batch_size=batch,
        num_attention_heads=16, num_query_groups=4, swiglu=True, ffn_hidden_size=5632,
    )
    assert 0 < gqa != got


def test_import_is_light() -> None:
    code = (
        "import sys, torchprof_args; "
        "bad = [m for m in ('torch', 'wandb', 'tensorboard', 'torchprof_args.capture.metrics.writer', "
        "'torchprof_args.capture.metrics.timers') if m in sys.modules]; "
        "print(bad)"
    )
    env = _child_env(Path("."))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
