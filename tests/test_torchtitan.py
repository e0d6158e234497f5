"""torchtitan on CPU, everything up to the train loop (its trainer sets the CUDA device, so the loop
itself runs in tests/gpu/test_gpu_torchtitan.py): the ``[torch_profile]`` section parsed by
torchtitan's own config manager and tyro from the registry's flags, the one-line refusals at parse
time (torchtitan's profiler or memory snapshots next to ours, bad values), the profiled trainer
class, and torchtitan's tokenizer and data loader on the assets the GPU test uses."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from helpers.processes import subprocess_env
from helpers.titan_assets import make_titan_assets

pytest.importorskip("torchtitan.trainer", reason="torchtitan (the torchtitan extra) is not installed")

from torchprof_args.capture.frameworks.flag_fields import host_flags  # noqa: E402
from torchprof_args.torchtitan import parse_config, profiled_config_class, run_config  # noqa: E402

pytestmark = pytest.mark.slow  # torchtitan's import takes seconds
DEBUG = ["--module", "llama3", "--config", "llama3_debugmodel"]


def test_section_holds_every_host_flag_and_parses_both_spellings():
    config = parse_config([*DEBUG, "--torch_profile.enable", "--torch_profile.step_start", "4",
                           "--torch-profile.step-end", "6", "--torch_profile.ranks", "0,1",
                           "--torch_profile.metrics_peak_tflops", "989", "--training.steps", "8"])
    names = {field.name for field in dataclasses.fields(config.torch_profile)}
    assert len(names) == len(host_flags()) and {"enable", "step_start", "metrics_peak_tflops"} <= names
    run = run_config(config, world_size=2)
    assert run.profiler.enabled and run.profiler.trace.schedule.describe() == (
        "record iterations 4..5 after 1 warmup step(s)")
    assert run.profiler.trace.ranks == (0, 1) and run.metrics.peak_tflops == 989.0
    from torchtitan.trainer import Trainer

    owner = type(config)._owner
    assert issubclass(owner, Trainer) and owner.__name__ == "TorchProfiledTrainer"
    assert profiled_config_class(Trainer.Config) is type(config)  # one derived class per base


def test_torchtitan_s_own_profiler_ends_the_parse_with_one_line(tmp_path):
    """The command line as users run it: one line on standard error, exit status 2, no traceback."""
    argv = ["--torch_profile.enable", "--profiler.enable_profiling"]
    proc = subprocess.run([sys.executable, "-m", "torchprof_args.torchtitan", *DEBUG, *argv], cwd=tmp_path,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "torchprof_args.torchtitan: error: --torch_profile.enable cannot run together with torchtitan's "
        "--profiler.enable_profiling"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (["--torch_profile.enable", "--torch_profile.memory_snapshot", "--profiler.enable_memory_snapshot"],
     "--torch_profile.memory_snapshot cannot run together with torchtitan's "
     "--profiler.enable_memory_snapshot"),
    (["--torch_profile.step_start", "5", "--torch_profile.step_end", "3"],
     "--torch_profile.step_end (3) must be greater than --torch_profile.step_start (5)"),
    (["--torch_profile.wait", "-2"], "--torch_profile.wait: must be >= 0, got -2"),
    (["--torch_profile.ranks", "0,x"], "--torch_profile.ranks: expected a whole number >= 0 or 'all'"),
])
def test_bad_settings_end_the_parse_with_one_line(argv, message, capsys, monkeypatch, tmp_path):
    """``main`` in this process (torchtitan is imported once): the same parse, the same line."""
    from torchprof_args.torchtitan import main

    monkeypatch.chdir(tmp_path)
    assert main([*DEBUG, *argv]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("torchprof_args.torchtitan: error: ") and (
        message in errors[0]), errors


def test_tokenizer_and_data_loader_build_from_the_test_assets(tmp_path, monkeypatch):
    """The assets tests/gpu/test_gpu_torchtitan.py trains on, read by torchtitan's own components."""
    make_titan_assets(tmp_path)
    monkeypatch.chdir(tmp_path)
    config = parse_config([*DEBUG, "--training.seq_len", "32", "--training.local_batch_size", "2"])
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(dp_world_size=2, dp_rank=1, tokenizer=tokenizer, seq_len=32,
                                     local_batch_size=2)
    inputs, labels = next(iter(loader))
    assert inputs["input"].shape == labels.shape == (2, 32)
    assert int(inputs["input"].max()) < 2048  # the debug model's embeddings


class _LoopOfTheTrainer:
    """Stands in for torchtitan's ``Trainer``, which cannot start without CUDA: its loop's contract as
    ``Trainer.train`` keeps it (``step`` counted before ``train_step``; the metrics processor's ``log``
    at its log steps, with ``extra_metrics``), around real work, a real ``ParallelDims`` and the real
    parsed config.  The mixin in front of it is the one ``python -m torchprof_args.torchtitan`` uses."""

    def __init__(self, config, steps: int) -> None:
        import torch
        from torchtitan.distributed import ParallelDims

        self.config, self.steps, self.step = config, steps, 0
        self.parallel_dims = ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, world_size=1)
        self.gradient_accumulation_steps = 1
        self.weights = torch.randn(64, 64, requires_grad=True)
        self.metrics_processor = _Processor(self.parallel_dims)

    def train(self) -> None:
        while self.step < self.steps:
            self.step += 1
            self.train_step(None)

    def train_step(self, data_iterator) -> None:
        import torch

        loss = (torch.randn(8, 64) @ self.weights).square().mean()
        loss.backward()
        loss = loss.detach()
        self.metrics_processor.ntokens_since_last_log += 8 * 64
        if self.step % 2 == 0:
            self.metrics_processor.log(self.step, loss.item(), loss.item(), 1.0)


class _Processor:
    """The metrics processor's fields the mixin reads, and what its ``log`` received."""

    def __init__(self, parallel_dims) -> None:
        self.parallel_dims, self.num_flops_per_token, self.ntokens_since_last_log = parallel_dims, 1e6, 0
        self.logged: dict[int, dict] = {}

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None) -> None:
        self.logged[step] = dict(extra_metrics or {})
        self.ntokens_since_last_log = 0


def test_the_mixin_runs_the_loop_under_the_profiler_and_feeds_the_metrics_processor(tmp_path):
    from helpers.trace_events import profiler_steps

    from torchprof_args.capture.frameworks.torchtitan_trainer import TorchProfileTrainerMixin

    config = parse_config([*DEBUG, "--torch_profile.enable", "--torch_profile.step_start", "3",
                           "--torch_profile.step_end", "5", "--torch_profile.dir", str(tmp_path / "prof"),
                           "--torch_profile.metrics_peak_tflops", "1"])
    trainer = type("Profiled", (TorchProfileTrainerMixin, _LoopOfTheTrainer), {})(config, steps=6)
    trainer.train()
    (trace,) = sorted((tmp_path / "prof").glob("iter000003-000004/*.pt.trace.json.gz"))
    assert profiler_steps(trace) == [3, 4]
    logged = trainer.metrics_processor.logged
    assert sorted(logged) == [2, 4, 6]
    for figures in logged.values():
        assert figures["timers/step-time"] > 0 and figures["iteration-time"] > 0
        # torchtitan's count: 1e6 FLOPs per token x 512 tokens per step
        assert figures["throughput"] == pytest.approx(1e6 * 512 / figures["iteration-time"] / 1e12, rel=1e-6)
        assert figures["mfu"] == pytest.approx(100 * figures["throughput"])
    # torchtitan logs inside its step, before the profiler's step: the flush after step 4 shows at 6
    assert (logged[4]["profiler/fence_waits"], logged[6]["profiler/fence_waits"]) == (0, 1)
    assert "log" not in vars(trainer.metrics_processor)  # unwrapped when train() returned
