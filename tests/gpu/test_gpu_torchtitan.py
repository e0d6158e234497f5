"""torchtitan's llama3 debug model trained by ``python -m torchprof_args.torchtitan`` on one GPU
(torchtitan's trainer needs CUDA; tests/test_torchtitan.py covers everything before the loop on CPU):
traces of exactly the asked steps, the timers, throughput and MFU from torchtitan's own FLOP count
in its metrics processor's TensorBoard events, torchtitan's own log line beside them."""

from __future__ import annotations

import gzip
import json
import sys

import pytest
from helpers.cuda import requires_gpus
from helpers.processes import free_port, subprocess_env
from helpers.titan_assets import make_titan_assets

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1)]


def test_debug_model_steps_traces_and_metrics_on_one_gpu(tmp_path):
    pytest.importorskip("torchtitan.trainer", reason="torchtitan (the torchtitan extra) is not installed")
    import subprocess

    make_titan_assets(tmp_path)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
               f"--master_port={free_port()}", "-m", "torchprof_args.torchtitan",
               "--module", "llama3", "--config", "llama3_debugmodel", "--training.steps", "6",
               "--training.seq_len", "256", "--training.local_batch_size", "2", "--metrics.log_freq", "2",
               "--metrics.enable_tensorboard", "--checkpoint.no-enable", "--validator.no-enable",
               "--torch_profile.enable", "--torch_profile.step_start", "3", "--torch_profile.step_end", "5",
               "--torch_profile.dir", str(tmp_path / "prof"), "--torch_profile.metrics_peak_tflops", "989"]
    proc = subprocess.run(command, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    (trace,) = sorted((tmp_path / "prof").glob("iter000003-000004/rank00000_*.pt.trace.json.gz"))
    with gzip.open(trace, "rt") as handle:
        data = json.load(handle)
    steps = sorted({e["name"] for e in data["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#3", "ProfilerStep#4"]
    assert data["torchprof_args"]["trainer"]["framework"].startswith("torchtitan")
    assert any(e.get("cat") == "kernel" for e in data["traceEvents"]), "CUDA kernels recorded"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events_dir,) = {path.parent for path in tmp_path.glob("outputs/tb/*/events.out.tfevents.*")}
    accumulator = EventAccumulator(str(events_dir))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"tflops", "mfu(%)"} <= tags, tags  # torchtitan's own
    assert {"iteration-time", "throughput", "mfu", "timers/step-time", "timers/torch-profile-flush-time",
            "profiler/flush_seconds"} <= tags, tags  # ours, through its metrics processor
    ours = accumulator.Scalars("throughput")[-1].value
    theirs = accumulator.Scalars("tflops")[-1].value
    assert ours == pytest.approx(theirs, rel=0.5)  # the same FLOP count, measured over other intervals


def test_moe_debug_model_s_tokens_per_expert_are_recorded_with_the_traces(tmp_path):
    """torchtitan's DeepSeek-V3 debug model (8 experts, top-3, selective activation checkpointing) on
    one GPU: the trainer mixin watches its MoE layers, and the cycle folder's ``expert_tokens/`` holds
    each traced step's routed tokens per layer, every token counted once per chosen expert (its
    buffer counts a recomputed forward again; the file does not)."""
    pytest.importorskip("torchtitan.trainer", reason="torchtitan (the torchtitan extra) is not installed")
    import subprocess

    from torchprof_args.shared.expert_tokens_file import load_expert_tokens

    make_titan_assets(tmp_path)
    batch, seq_len, top_k = 2, 256, 3
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
               f"--master_port={free_port()}", "-m", "torchprof_args.torchtitan",
               "--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel", "--training.steps", "6",
               "--training.seq_len", str(seq_len), "--training.local_batch_size", str(batch),
               "--checkpoint.no-enable", "--validator.no-enable",
               "--torch_profile.enable", "--torch_profile.step_start", "3", "--torch_profile.step_end", "5",
               "--torch_profile.dir", str(tmp_path / "prof")]
    proc = subprocess.run(command, cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    cycle = tmp_path / "prof" / "iter000003-000004"
    (path,) = sorted(cycle.glob("expert_tokens/rank00000_*.expert_tokens.json"))
    doc = load_expert_tokens(path)
    assert doc["iterations"] == [3, 4] and doc["experts"] == 8 and doc["layers"], doc
    assert doc["ep_ranks"] is None  # expert_parallel_degree 1
    for step in doc["counts"]:
        assert [sum(layer) for layer in step] == [batch * seq_len * top_k] * len(doc["layers"]), step
