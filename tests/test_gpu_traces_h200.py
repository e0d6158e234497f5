"""What the H200 traces this package recorded itself (``tests/data/gpu_1rank_h200_torchprof_*``,
see its README) prove on CPU: FLOPs counted from the recorded shapes equal the model's FLOPs by
hand; ``torchprof diagnose`` finds the slow data loader put into the ``faulty`` job (a 30 ms sleep
per batch) and not in the ``clean`` one; and the ``loss.item()`` put into the same steps is seen
but costs nothing on this CPU-bound small model (the GPU has drained its queue before the call),
so it is rightly no finding, and the loader's idle time is not counted twice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.examples import run_doc_example
from helpers.paths import DATA
from helpers.processes import subprocess_env

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.analysis.diagnose.documents import MfuInputs
from torchprof_args.analysis.diagnose.kinds import host_sync
from torchprof_args.analysis.diagnose.kinds.low_mfu import mfu_inputs
from torchprof_args.analysis.diagnose.spans import sync_events
from torchprof_args.analysis.render.diagnosis import MAX_LINES

CLEAN = DATA / "gpu_1rank_h200_torchprof_clean.json.gz"
FAULTY = DATA / "gpu_1rank_h200_torchprof_faulty.json.gz"
#: the job's model (benchmarks/gpu_check_analysis.py SIZES, batch 4)
HIDDEN, LAYERS, VOCAB, SEQ, BATCH = 1024, 4, 8192, 1024, 4
LOADER_SLEEP_MS = 30.0


def model_flops_per_step() -> float:
    """By hand: 6 FLOPs per parameter per token through the blocks' four linear layers (12 h^2) and
    the vocabulary head, plus attention's two products (4 B S^2 h forward, 2.5x that backward)."""
    tokens = BATCH * SEQ
    linear = 6 * 12 * HIDDEN**2 * tokens * LAYERS
    head = 6 * VOCAB * HIDDEN * tokens
    attention = 3.5 * 4 * BATCH * SEQ**2 * HIDDEN * LAYERS
    return float(linear + head + attention)


@pytest.mark.parametrize("path", [CLEAN, FAULTY], ids=["clean", "faulty"])
def test_flops_from_shapes_equal_the_hand_calculation(path) -> None:
    inputs = mfu_inputs(load_trace(path, flops=True))
    assert isinstance(inputs, MfuInputs) and inputs.device == "NVIDIA H200"
    assert inputs.flops_per_step == pytest.approx(model_flops_per_step(), rel=1e-9)


def _diagnose(path) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "torchprof_args", "diagnose", "--json", str(path)],
        capture_output=True, text=True, timeout=120, env=subprocess_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.slow
def test_diagnose_finds_the_slow_loader_only_where_it_is() -> None:
    faulty = {f["kind"]: f for f in _diagnose(FAULTY)["findings"]}
    clean = _diagnose(CLEAN)
    assert faulty["dataloader_stall"]["ms_per_step"] == pytest.approx(LOADER_SLEEP_MS, rel=0.10)
    assert list(faulty)[0] == "dataloader_stall", list(faulty)
    kinds = [f["kind"] for f in clean["findings"]]
    assert "dataloader_stall" not in kinds and "host_sync" not in kinds, kinds
    assert "low_mfu" in kinds and not clean["gaps"], clean  # shapes were recorded: MFU is judged
    assert sum(f["saving_ms_per_step"] for f in faulty.values()) <= _step_ms(FAULTY)  # nothing twice


def _step_ms(path) -> float:
    return context(load_trace(path)).step_us / 1000.0


def test_the_item_in_every_step_is_seen_and_costs_nothing_here() -> None:
    trace = load_trace(FAULTY)
    ctx = context(trace)
    calls = sync_events(trace, ctx)
    blocked_ms = float(trace.dur[calls].sum()) / ctx.n_steps / 1000.0
    assert len(calls) / ctx.n_steps >= 2  # .item(): the DtoH copy's runtime call and its stream sync
    assert blocked_ms < 1.0  # the GPU had finished: the CPU, not the GPU, is this step's bottleneck
    assert host_sync.analyze(trace) is None


@pytest.mark.slow
def test_doc_example_on_the_h200_trace(tmp_path) -> None:
    proc = run_doc_example("diagnose-h200-trace", tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "torchprof diagnose: 1 rank, step 45.1 ms: 3 findings", lines[0]
    assert lines[1].startswith("1. dataloader_stall: saves 30.4 ms/step"), lines[1]
    assert "on the critical path, per-rank bound 30.5 ms" in lines[1]
    assert any(line.startswith("3. low_mfu") for line in lines) and len(lines) <= MAX_LINES
