"""torchtitan's tokens per expert: the in-job counter (``capture/runtime/companions/expert_tokens.py``)
on a real torchtitan MoE layer, and their reading by ``diagnose`` (``analysis/diagnose/expert_tokens.py``:
each expert's received tokens from every rank's routed counts).  The real 2-rank job is in
tests/test_modern_jobs.py (``--titan-router``)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.paths import DATA
from torch import nn
from torch.utils.checkpoint import checkpoint

from torchprof_args.analysis.diagnose.expert_tokens import (
    TORCHTITAN_TOKENS,
    expert_tokens_beside,
    recorded_expert_tokens,
)
from torchprof_args.atomic import write_json_atomically
from torchprof_args.console import main as torchprof
from torchprof_args.naming import EXPERT_TOKENS_SUBDIR, EXPERT_TOKENS_SUFFIX, cycle_dir_name
from torchprof_args.shared import formats
from torchprof_args.shared.expert_tokens_file import load_expert_tokens, make_document

DIM, EXPERTS = 16, 4


@pytest.fixture
def titan_moe() -> tuple[nn.Module, nn.Module]:
    """Two real torchtitan MoE layers in a model, their routers biased to expert 2 and 1."""
    pytest.importorskip("torchtitan.models.common.moe", reason="torchtitan is not installed")
    from helpers.titan_moe import tiny_moe

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([tiny_moe(DIM, EXPERTS, hot=2, bias=0.05, seed=1),
                                         tiny_moe(DIM, EXPERTS, hot=1, bias=0.05, seed=2)])

        def forward(self, x: torch.Tensor, recompute: str = "") -> torch.Tensor:
            for layer in self.layers:
                reentrant = recompute == "reentrant"
                x = x + (checkpoint(layer, x, use_reentrant=reentrant) if recompute else layer(x))
            return x

    model = Model()
    return model, model.layers


def _counter(model: nn.Module):  # noqa: ANN202 - the counter's type is imported with torch
    from torchprof_args.capture.runtime.companions.expert_tokens import ExpertTokenCounter

    counter = ExpertTokenCounter(rank=3)
    assert counter.watch(model, ep_ranks=[2, 3]) == 2
    assert counter.layers == ["layers.0", "layers.1"] and counter.experts == EXPERTS
    return counter


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["", "non-reentrant", "reentrant"])
def test_the_counts_are_the_router_s_choices_zeroed_or_not_and_recomputed_or_not(
        titan_moe: tuple[nn.Module, nn.Module], tmp_path: Path, recompute: str) -> None:
    """Each recorded step's tokens per expert and layer are the router's choices in that step's
    forwards (two micro-batches), whether the buffer is zeroed after each step (layer 0, as
    torchtitan's load balancing does) or never (layer 1), and with activation checkpointing (the
    buffer counts the recomputation again; the file does not).  Steps outside the window, and forwards
    in eval mode, are not counted."""
    from helpers.titan_moe import RouterChoices

    model, layers = titan_moe
    choices = [RouterChoices(layer, EXPERTS) for layer in layers]
    counter = _counter(model)
    truth: list[list[list[int]]] = []
    generator = torch.Generator().manual_seed(5)
    for iteration in range(1, 6):
        recorded = iteration in (3, 4)
        if iteration == 3:
            counter.start()
        for _ in range(2):  # gradient accumulation: two micro-batches per step
            x = torch.randn(2, 32, DIM, generator=generator, requires_grad=True)
            model(x, recompute).square().mean().backward()
        with torch.no_grad():
            model.eval()
            model(torch.randn(1, 8, DIM, generator=generator))  # an evaluation: torchtitan counts none
            model.train()
        step = [c.take() for c in choices]
        if recorded:
            truth.append(step)
            counter.end_step(iteration)
        layers[0].tokens_per_expert_E.zero_()  # load balancing's pre-hook (layer 1: never zeroed)
    if recompute:  # torchtitan's buffer counted the recomputed forward again (its optimizer halves it)
        assert layers[1].tokens_per_expert_E.sum().item() == 2 * 5 * 2 * 2 * 32
    path = counter.finish(tmp_path)
    assert path is not None and not counter.active
    doc = load_expert_tokens(path)
    assert doc["rank"] == 3 and doc["iterations"] == [3, 4] and doc["ep_ranks"] == [2, 3]
    assert doc["layers"] == ["layers.0", "layers.1"] and doc["experts"] == EXPERTS
    assert doc["counts"] == truth
    assert sum(truth[0][0]) == 2 * 2 * 32  # every token of the step, once
    assert max(range(EXPERTS), key=truth[0][0].__getitem__) == 2
    assert max(range(EXPERTS), key=truth[0][1].__getitem__) == 1


@pytest.mark.slow
def test_a_compiled_model_counts_as_the_same_model_in_eager_mode(
        titan_moe: tuple[nn.Module, nn.Module], tmp_path: Path) -> None:
    """torchtitan compiles each block with ``fullgraph=True``: the hooks trace into its graph (no
    graph break) and count what the same model counts uncompiled."""
    import copy

    model, layers = titan_moe
    eager = copy.deepcopy(model)
    counters = [_counter(model), _counter(eager)]
    for layer in layers:
        layer.compile(backend="aot_eager", fullgraph=True)
    generator = torch.Generator().manual_seed(7)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):  # as torchtitan's apply_compile
        for iteration in (1, 2, 3):
            if iteration == 2:
                for counter in counters:
                    counter.start()
            x = torch.randn(2, 32, DIM, generator=generator)
            for net, counter in zip((model, eager), counters, strict=True):
                net(x).square().mean().backward()
                counter.end_step(iteration)
    torch._dynamo.reset()
    docs = [load_expert_tokens(c.finish(tmp_path / str(i)) or tmp_path) for i, c in enumerate(counters)]
    assert docs[0]["iterations"] == [2, 3] and docs[0]["counts"] == docs[1]["counts"]
    assert all(sum(layer) == 2 * 32 for step in docs[0]["counts"] for layer in step)


@pytest.mark.slow
def test_a_dropped_window_writes_nothing(titan_moe: tuple[nn.Module, nn.Module], tmp_path: Path) -> None:
    model, _ = titan_moe
    counter = _counter(model)
    counter.start()
    model(torch.randn(1, 8, DIM))
    counter.end_step(1)
    counter.discard()
    assert counter.finish(tmp_path) is None and not list(tmp_path.iterdir())
    counter.remove()
    counter.start()
    model(torch.randn(1, 8, DIM))  # unhooked: nothing counted
    counter.end_step(2)
    path = counter.finish(tmp_path)
    assert path is not None and load_expert_tokens(path)["counts"] == [[[0.0] * EXPERTS] * 2]


@pytest.mark.slow
def test_the_torchtitan_trainer_watches_every_model_part(titan_moe: tuple[nn.Module, nn.Module]) -> None:
    """What the trainer mixin does at its start (its loop needs CUDA: tests/gpu/test_gpu_torchtitan.py):
    every model part's MoE layers watched, no expert-parallel group without expert parallelism."""
    from types import SimpleNamespace

    from torchtitan.distributed.parallel_dims import ParallelDims

    from torchprof_args import TorchProfiler, add_torch_profile_args
    from torchprof_args.capture.frameworks.torchtitan_trainer import titan_ep_ranks, watch_titan_experts

    model, _ = titan_moe
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1)
    trainer = SimpleNamespace(model_parts=[model, nn.Linear(2, 2)], parallel_dims=dims)
    parser = add_torch_profile_args(argparse.ArgumentParser())
    prof = TorchProfiler.from_args(parser.parse_args(["--torch-profile"]))
    assert titan_ep_ranks(dims) is None
    assert watch_titan_experts(prof, trainer) == 2
    assert watch_titan_experts(prof, trainer) == 0  # watched once


# -- the offline side: each expert's received tokens ------------------------------------------------


def _write(folder: Path, rank: int, iterations: list[int], counts: list[list[list[float]]],
           ep_ranks: list[int] | None = (0, 1)) -> Path:  # type: ignore[assignment]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank:05d}_h_pid1{EXPERT_TOKENS_SUFFIX}"
    layers = [f"layers.{i}.moe" for i in range(len(counts[0]))]
    write_json_atomically(path, make_document(
        rank=rank, source="test", iterations=iterations, layers=layers, experts=len(counts[0][0]),
        ep_ranks=list(ep_ranks) if ep_ranks is not None else None, counts=counts))
    return path


def test_each_expert_receives_what_every_rank_of_its_group_routed_to_it(tmp_path: Path) -> None:
    """4 experts on 2 expert-parallel ranks (2 each): expert e on rank e // 2; per iteration, summed
    over the layers, the mean over the cycle's iterations."""
    cycle = tmp_path / cycle_dir_name(3, 4)
    folder = cycle / EXPERT_TOKENS_SUBDIR
    _write(folder, 0, [3, 4], [[[1, 2, 30, 3], [0, 0, 10, 0]], [[3, 2, 50, 1], [0, 0, 10, 0]]])
    _write(folder, 1, [3, 4], [[[2, 2, 40, 0], [0, 0, 0, 10]], [[0, 2, 20, 2], [0, 0, 0, 10]]])
    trace = cycle / "rank00000_h_pid1.pt.trace.json.gz"
    trace.write_bytes(b"")
    found = expert_tokens_beside([trace])
    assert found is not None and found.source == TORCHTITAN_TOKENS and found.traced
    assert found.iterations == [3, 4] and found.path == str(folder)
    # rank 0's experts 0, 1: (1+2 + 3+0) / 2 = 3, (2+2 + 2+2) / 2 = 4; rank 1's: expert 2 gets
    # (30+10+40 + 50+10+20) / 2 = 80, expert 3 (3+0+0+10 + 1+0+2+10) / 2 = 13
    assert found.per_rank == {0: [3.0, 4.0], 1: [80.0, 13.0]}
    assert found.hottest == (1, 0) and found.imbalance_factor == pytest.approx(80 / 25)


def test_without_expert_parallelism_each_rank_holds_every_expert(tmp_path: Path) -> None:
    _write(tmp_path, 0, [7], [[[1, 5]]], ep_ranks=None)
    _write(tmp_path, 1, [7], [[[2, 2]]], ep_ranks=None)
    found = recorded_expert_tokens(tmp_path)
    assert found is not None and found.per_rank == {0: [1.0, 5.0], 1: [2.0, 2.0]} and not found.traced


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["version", "corrupt", "rows"])
def test_a_file_of_another_version_or_a_damaged_one_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    """Through ``--expert-tokens``: the command's one error line naming the file, no traceback; beside
    the traces: one stderr line naming it, and the diagnosis goes on without tokens per expert."""
    cycle = tmp_path / cycle_dir_name(3, 4)
    path = _write(cycle / EXPERT_TOKENS_SUBDIR, 0, [3], [[[1, 2]]])
    doc = json.loads(path.read_text())
    if damage == "version":
        path.write_text(json.dumps({**doc, "version": formats.EXPERT_TOKENS.version + 1}))
    elif damage == "corrupt":
        path.write_text(path.read_text()[:40])
    else:
        path.write_text(json.dumps({**doc, "counts": [[[1]]]}))
    trace = cycle / "rank00000_h_pid1.pt.trace.json.gz"
    shutil.copy(DATA / "cpu_2rank_gloo_rank0_iter3.json.gz", trace)  # a real trace: diagnose reads it
    problems: list[str] = []
    assert expert_tokens_beside([trace], problems=problems) is None
    assert len(problems) == 1 and str(path) in problems[0] and "\n" not in problems[0], problems
    assert torchprof(["diagnose", str(cycle), "--expert-tokens", str(cycle), "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "Traceback" not in err[0], err
    if damage == "version":
        assert f"version {formats.EXPERT_TOKENS.version + 1}" in err[0]
        assert f"reads version {formats.EXPERT_TOKENS.version}" in err[0]
    assert torchprof(["diagnose", str(cycle), "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["findings"] is not None
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"torchprof diagnose: tokens per expert not read: {problems[0]}", err
