"""Megatron integration: flags as extra_args_provider, rank selection by parallel coordinates, and
Megatron-LM's real code (megatron.training at core_v0.16.1 and core_v0.19.0, tests/megatron_lm.py):
install()/uninstall() on its training module, its parser with our provider, the refusals at parse
time, and its real pretrain() of a tiny GPT on 2 gloo CPU ranks (tensor parallel 2), profiled
through install() via the README's example: exit-interval inside an open window, resume, global
iterations in ProfilerStep#, the flush timer on TensorBoard.  Without a Megatron-LM tree those
tests skip with the reason."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.megatron_lm import CPU_FLAGS, pythonpath, takes_config_container, tree_params
from helpers.paths import REPO
from helpers.processes import subprocess_env

from torchprof_args import TorchProfileArgsError, add_torch_profile_args
from torchprof_args import megatron as tpm
from torchprof_args.capture.config import configs_from_args
from torchprof_args.capture.frameworks.megatron_install import _hook_for as hook_for
from torchprof_args.capture.runtime import ranks as traced
from torchprof_args.capture.runtime.config import parallel_selector


def test_megatron_pytorch_profiler_is_refused():
    args = argparse.Namespace(torch_profile=True, profile=True, use_pytorch_profiler=True)
    with pytest.raises(TorchProfileArgsError, match="--profile --use-pytorch-profiler"):
        tpm.check_megatron_args(args)
    tpm.check_megatron_args(argparse.Namespace(torch_profile=False, profile=True, use_pytorch_profiler=True))


def test_parallel_selector_and_resolution():
    assert parallel_selector("dp=0") == ("dp", (0,))
    assert parallel_selector("TP=3,0-1") == ("tp", (0, 1, 3))
    for bad in ("dp", "xx=0", "dp=a", "pp=3-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parallel_selector(bad)
    # 8 ranks, tp 2 x pp 2 x dp 2 in Megatron's default order (tp fastest, then dp, then pp).
    coords = [{"tp": r % 2, "dp": (r // 2) % 2, "pp": r // 4, "cp": 0, "ep": 0} for r in range(8)]
    assert traced.resolve_parallel_ranks([("dp", (0,))], coords) == [0, 1, 4, 5]
    assert traced.resolve_parallel_ranks([("dp", (0,)), ("pp", (1,))], coords) == [4, 5]
    with pytest.raises(TorchProfileArgsError, match="given more than once"):
        traced.resolve_parallel_ranks([("dp", (0,)), ("dp", (1,))], coords)
    with pytest.raises(TorchProfileArgsError, match="selects no rank"):
        traced.resolve_parallel_ranks([("dp", (5,))], coords)


@pytest.mark.slow
def test_parallel_ranks_without_parallel_state_are_data_parallel(tmp_path, monkeypatch):
    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args(["--torch-profile", "--torch-profile-dir", str(tmp_path),
                              "--torch-profile-parallel-ranks", "dp=0", "tp=0"])
    assert traced.traced_ranks(configs_from_args(args).profiler.trace) == (0,)


def test_install_fails_clearly_without_megatron_lm_or_with_an_unknown_layout(monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron.training.training", None)  # import raises ImportError
    with pytest.raises(tpm.MegatronIntegrationError, match="needs Megatron-LM"):
        tpm.install()
    odd = types.ModuleType("megatron.training.training")
    odd.train = odd.get_args = odd.get_timers = lambda *a: None
    odd.training_log = lambda loss_dict, step: None  # no 'iteration' parameter
    monkeypatch.setitem(sys.modules, "megatron.training.training", odd)
    with pytest.raises(tpm.MegatronIntegrationError, match="layout is unknown"):
        tpm.install()


def test_train_without_the_args_provider_fails_clearly():
    training = types.SimpleNamespace(get_args=lambda: argparse.Namespace(iteration=0),
                                     get_timers=lambda: None)
    with pytest.raises(tpm.MegatronIntegrationError, match="extra_args_provider=torchprof_args.megatron"):
        hook_for(training)


def _profiler_steps(path: Path) -> list[int]:
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events
                   if e.get("name", "").startswith("ProfilerStep#")})


def _tensorboard_values(directory: Path) -> dict[str, dict[int, float]]:
    """``tag -> {step: value}`` of every TensorBoard event file in ``directory``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[str, dict[int, float]] = {}
    for events in sorted(directory.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            values.setdefault(tag, {}).update((e.step, e.value) for e in accumulator.Scalars(tag))
    return values


def _tensorboard_scalars(directory: Path) -> dict[str, list[int]]:
    return {tag: list(steps) for tag, steps in _tensorboard_values(directory).items()}


def tiny_gpt_flops() -> int:
    """Model FLOPs of one iteration of the worked example's GPT, by hand: 2 layers, hidden 64, 4
    heads (kv channels 16, no GQA), FFN 4h, sequence 32, global batch 4, vocabulary 128 padded by
    Megatron to a multiple of 128 x TP 2 = 256; 2 FLOPs per multiply-add, x3 for forward + backward;
    causal attention counts half the s x s scores (Megatron-LM's convention)."""
    batch, seq, hidden, layers, ffn, vocab = 4, 32, 64, 2, 256, 256
    attention = hidden * 3 * hidden + hidden * seq + hidden * hidden  # QKV, QK^T and AV (halved), out
    mlp = 2 * hidden * ffn
    per_token = 2 * 3 * (layers * (attention + mlp) + hidden * vocab)
    return batch * seq * per_token  # 91,226,112


@pytest.mark.slow
@pytest.mark.parametrize("tree", tree_params())
def test_megatron_lm_install_parser_and_refusals_at_parse_time(tree, tmp_path):
    """Real megatron.training: install()/uninstall(), its parser with composed providers, and
    conflicting or bad flags refused when Megatron parses them, before anything is built."""
    result_path = tmp_path / "result.json"
    env = subprocess_env()
    env["PYTHONPATH"] = ":".join([*map(str, pythonpath(tree)), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "jobs" / "megatron_lm_checks.py"),
                           str(result_path), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(result_path.read_text())
    # pretrain(cfg_container, ...) from core_v0.18.0; pretrain(..., extra_args_provider=...) before.
    assert result["config_container"] is takes_config_container(tree)
    assert result["install"] == {"patched": ["train", "training_log", "checkpoint_and_decide_exit"],
                                 "idempotent": True, "installed": True, "restored": True,
                                 "installed_after_uninstall": False}
    parse = result["parse"]  # Megatron's own flags are reused, ours and the user's added
    assert parse["my_flag"] == 5 and parse["log_interval"] == 7 and parse["timing_log_level"] == 2
    assert parse["tensorboard_dir"] == str(tmp_path / "tb") and parse["num_layers"] == 2
    assert parse["torch_profile"] and parse["parallel_ranks"] == [["dp", [0]], ["tp", [0, 1]]]
    for case, message in [("conflict", "--torch-profile cannot run together with Megatron's --profile "
                                       "--use-pytorch-profiler"),
                          ("bad_rank", "--torch-profile-ranks 5 outside the world size 2")]:
        outcome = result[case]
        assert outcome["exit_code"] == 2, outcome
        assert len(outcome["errors"]) == 1 and message in outcome["errors"][0], outcome
        # refused while Megatron parsed: no process group, model or data was built
        assert outcome["built"] == [] and not outcome["distributed"], outcome


@pytest.mark.slow
@pytest.mark.parametrize("tree", tree_params())
def test_readme_example_real_pretrain_exit_in_window_resume_and_flush_timer(tree, tmp_path):
    """Megatron-LM's real pretrain() of a tiny GPT, TP 2 on 2 gloo CPU ranks, profiled by install():
    --exit-interval 5 inside the window 4-6 flushes 4-5 at exit (timed and written); the resumed
    run (launch.sh) traces global iteration 8 on both ranks."""
    proc = run_doc_example("megatron", tmp_path, pythonpath=pythonpath(tree), timeout=600,
                           MEGATRON_LM=str(tree), CPU_FLAGS=CPU_FLAGS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    tb = tmp_path / "tb"
    traces = sorted(tb.glob("iter*/*.pt.trace.json.gz"))
    windows = sorted(f"{p.parent.name}/{p.name.split('_')[0]}" for p in traces)
    assert windows == ["iter000004-000005/rank00000", "iter000004-000005/rank00001",
                       "iter000008-000008/rank00000", "iter000008-000008/rank00001"], windows
    for trace in traces:
        # The exit window: steps 4 and 5, then torch.profiler's open ProfilerStep#6 holds the rest of
        # iteration 5's loop body after training_log (the checkpoint save and the exit decision).
        assert _profiler_steps(trace) == (
            [8] if trace.parent.name == "iter000008-000008" else [4, 5, 6]), trace
    assert not list(tb.rglob(".partial-*"))
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "5"

    scalars = _tensorboard_scalars(tb)
    # Megatron's Timers.write: "<timer>-time"; the exit flush (5) like the scheduled one (8)
    assert sorted(scalars["torch-profile-flush-time"]) == [5, 8]
    assert sorted(scalars["lm loss"]) == [1, 2, 3, 4, 5, 6, 7, 8]  # exited at 5, resumed to 8

    # TFLOP/s from Megatron-LM's own num_floating_point_operations (the last rank's info line), against
    # the hand calculation; MFU against --metrics-peak-tflops 1 (first run only: the resume has no peak)
    flops = [float(f) for f in re.findall(r"model FLOPs per iteration ([0-9.e+]+)", proc.stdout)]
    assert len(flops) == 8 and all(f == pytest.approx(tiny_gpt_flops(), rel=1e-5) for f in flops), flops
    values = _tensorboard_values(tb)
    assert sorted(values["throughput"]) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sorted(values["mfu"]) == [1, 2, 3, 4, 5]
    for step, mfu in values["mfu"].items():
        assert mfu == pytest.approx(100.0 * values["throughput"][step], rel=1e-5)
    assert "MFU is not logged: no peak TFLOP/s known for no GPU" in proc.stdout + proc.stderr
    # Megatron's own Timers (level 1): the slowest rank and straggler scores of the same gather
    assert sorted(values["forward-backward-time-max-rank"]) == [1, 2, 3, 4, 5]
    assert set(values["forward-backward-time-max-rank"].values()) <= {0.0, 1.0}
    assert all(score >= 1.0 for score in values["stragglers/forward-backward-score-max"].values())

    # torchprof diagnose of the exit window on the critical path: the tensor-parallel all-reduces and
    # broadcasts the step waits for are the model's own communication (gloo's collectives block by
    # nature), so removing them is no saving; the late ranks alternate: no more than the bounds
    diagnosis = subprocess.run([sys.executable, "-m", "torchprof_args", "diagnose", str(tb), "--cycle", "4",
                                "--json", "--no-progress"], capture_output=True, text=True)
    assert diagnosis.returncode == 0, diagnosis.stderr[-3000:]
    found = {f["kind"]: f for f in json.loads(diagnosis.stdout)["findings"]}
    assert all(f["saving_basis"] == "critical path" for f in found.values())
    if "host_sync" in found:
        assert found["host_sync"]["saving_ms_per_step"] < 1.0 < found["host_sync"]["bound_ms_per_step"]
    for kind in ("collective_skew", "straggler"):
        if kind in found:
            assert found[kind]["saving_ms_per_step"] <= found[kind]["bound_ms_per_step"], found[kind]


class _ScalarLog:
    """A writer with TensorBoard's ``add_scalar``; records what is written and whether it was flushed."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, int]] = []
        self.flushed = 0

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        assert value >= 0
        self.scalars.append((tag, step))

    def flush(self) -> None:
        self.flushed += 1


@pytest.mark.slow
def test_training_hook_exit_flush_is_timed_and_written_like_a_scheduled_one(tmp_path):
    """Without Megatron-LM: TrainingHook (the hook install() builds) with Megatron-compatible timers;
    an early exit at 5 inside the window 4-6 is flushed, timed and written."""
    from torchprof_args import Timers

    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args(["--torch-profile", "--torch-profile-dir", str(tmp_path),
                              "--no-torch-profile-operator-table",
                              "--torch-profile-step-start", "4", "--torch-profile-step-end", "7"])
    writer = _ScalarLog()
    hook = tpm.TrainingHook(args, timers=Timers(0, "max"), writers=[writer, None])
    with hook:
        for iteration in range(1, 6):
            hook.step(iteration)
        assert hook.prof.window_open
        hook.flush_at_exit()  # what the checkpoint_and_decide_exit wrapper does when Megatron exits at 5
        assert not hook.prof.window_open
        hook.step(6)  # nothing more is recorded after the exit flush
    assert [Path(t).parent.name for t in hook.prof.published_traces] == ["iter000004-000005"]
    assert _profiler_steps(Path(hook.prof.published_traces[0]))[:2] == [4, 5]
    assert writer.scalars == [("timers/torch-profile-flush-time", 5)] and writer.flushed == 1
    assert not list(tmp_path.rglob(".partial-*"))


def test_megatron_flops_follows_both_signatures_of_num_floating_point_operations():
    """core_v0.16.1: ``(args, batch_size)``; core_v0.19.0 also takes training_log's packed-sequence
    sums, passed through only when training_log got them (the functions' real signatures)."""
    from torchprof_args.capture.frameworks.megatron_metrics import megatron_flops

    calls = []

    def old(args, batch_size):  # noqa: ANN001, ANN202
        calls.append((batch_size,))
        return 10.0 * batch_size

    def new(args, batch_size, seqlen_squared_sum_in_batch=None, total_real_tokens_in_batch=None):  # noqa: ANN001, ANN202
        calls.append((batch_size, seqlen_squared_sum_in_batch, total_real_tokens_in_batch))
        return 1.0

    args = argparse.Namespace(micro_batch_size=2, data_parallel_size=4)
    thd = {"seqlen_squared_sum_in_batch": 9.0, "total_real_tokens_in_batch": 3.0}
    assert megatron_flops(types.SimpleNamespace(num_floating_point_operations=old,
                                                get_num_microbatches=lambda: 3), args, thd) == 240.0
    megatron_flops(types.SimpleNamespace(num_floating_point_operations=new, get_num_microbatches=lambda: 3),
                   args, {**thd, "seqlen_squared_sum_in_batch": None})
    args.gtp_weight_remat_size = 2  # core_v0.19.0 counts the GTP-remat peers' micro-batches too
    megatron_flops(types.SimpleNamespace(num_floating_point_operations=new, get_num_microbatches=lambda: 3),
                   args, thd)
    assert calls == [(24,), (24, None, 3.0), (48, 9.0, 3.0)]
    assert megatron_flops(types.SimpleNamespace(), args, {}) is None  # no such function: no FLOPs
