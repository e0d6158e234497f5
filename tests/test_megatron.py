"""Megatron integration: flags as extra_args_provider, rank selection by parallel coordinates,
install()/uninstall() on Megatron-LM's training module, and a real megatron-core GPTModel with
tensor parallelism 2 on 2 gloo ranks, profiled through install() and resumed from a checkpoint.

Megatron-LM's ``megatron.training`` cannot be installed here; tests/megatron_lm_standin holds a
minimal stand-in with its module layout.  Everything else (megatron-core, torch.profiler, ranks)
is real."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import types
from pathlib import Path

import pytest
from conftest import REPO
from readme_examples import run_readme_example

from torchprof_args import TorchProfileArgsError, add_torch_profile_args
from torchprof_args import megatron as tpm
from torchprof_args.config import configs_from_args
from torchprof_args.runtime import ranks as traced
from torchprof_args.runtime.config import parallel_selector

STANDIN = REPO / "tests" / "megatron_lm_standin"


@pytest.fixture
def megatron_lm(monkeypatch):
    """Megatron-LM's training package (the stand-in) importable; unpatched afterwards."""
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in [m for m in sys.modules if m.startswith("megatron.training")]:
        monkeypatch.delitem(sys.modules, name)
    import megatron.training.training as training

    yield training
    tpm.uninstall()


def test_extra_args_provider_composes_and_reuses_megatron_flags(megatron_lm, monkeypatch):
    from megatron.training.arguments import parse_and_validate_args

    def mine(parser):
        parser.add_argument("--my-flag", type=int, default=3)  # returns None: allowed

    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", "--tensorboard-dir", "tb", "--log-interval", "7",
                                      "--torch-profile", "--torch-profile-parallel-ranks", "dp=0", "tp=0-1",
                                      "--my-flag", "5"])
    args = parse_and_validate_args(extra_args_provider=tpm.compose_args_providers(mine, tpm.extra_args_provider))
    assert args.my_flag == 5 and args.tensorboard_dir == "tb" and args.log_interval == 7
    assert args.torch_profile and args.torch_profile_parallel_ranks == [("dp", (0,)), ("tp", (0, 1))]


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


def test_parallel_ranks_without_parallel_state_are_data_parallel(tmp_path, monkeypatch):
    parser = add_torch_profile_args(argparse.ArgumentParser())
    args = parser.parse_args(["--torch-profile", "--torch-profile-dir", str(tmp_path),
                              "--torch-profile-parallel-ranks", "dp=0", "tp=0"])
    assert traced.traced_ranks(configs_from_args(args).profiler.trace) == (0,)


def test_install_is_idempotent_and_reversible(megatron_lm):
    original_train, original_log = megatron_lm.train, megatron_lm.training_log
    tpm.install()
    patched = megatron_lm.train
    tpm.install()
    assert megatron_lm.train is patched is not original_train and tpm.installed()
    tpm.uninstall()
    assert megatron_lm.train is original_train and megatron_lm.training_log is original_log
    assert not tpm.installed()


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


def _profiler_steps(path: Path) -> list[int]:
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#")})


def test_readme_example_gpt_tensor_parallel_profiled_and_resumed(tmp_path):
    proc = run_readme_example("megatron", tmp_path, pythonpath=[STANDIN])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    traces = sorted((tmp_path / "tb").glob("*.pt.trace.json.gz"))
    names = sorted(p.name.split("_")[0] + "_" + p.name.split("_iter")[1] for p in traces)
    assert names == ["rank00000_000003-000004.pt.trace.json.gz", "rank00001_000003-000004.pt.trace.json.gz",
                     "rank00001_000008-000008.pt.trace.json.gz"], names
    for trace in traces:
        expected = [8] if "iter000008" in trace.name else [3, 4]
        assert _profiler_steps(trace)[: len(expected)] == expected
    assert not list((tmp_path / "tb").glob(".partial-*"))

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[int]] = {}
    for events in (tmp_path / "tb").glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(e.step for e in accumulator.Scalars(tag))
    assert sorted(scalars["timers/torch-profile-flush-time"]) == [4, 8]
    # the slowest rank of each timer write, through the fixed-size gather under megatron-core's parallel state
    assert sorted(scalars["timers/torch-profile-flush-time-max-rank"]) == [4, 8]
    assert sorted(scalars["lm loss"]) == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # the model trained and resumed
