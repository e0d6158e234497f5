"""Memory by category against the truth: an MLP of known size trained with Adam (fp32, CPU), profiled
for real; PyTorch's categories (corrected) and the trace's own must give the analytic bytes.

The MLP ``d -> 2d -> 2d -> d`` has ``P = 4 (8 d^2 + 5 d)`` bytes of parameters, as many of gradients,
``2 P`` of Adam state; its forward pass keeps ``4 b (2d + 2d + d)`` bytes of activations for the
backward pass (both ReLU outputs and the output, which ``square()`` saves).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.memory.pytorch_profile import memory_part
from torchprof_args.analysis.memory.trace_memory import trace_memory_part

pytestmark = pytest.mark.slow

DIM = 256


def analytic(dim: int, batch: int) -> dict[str, int]:
    params = 4 * (8 * dim * dim + 5 * dim)
    return {"parameter": params, "gradient": params, "optimizer_state": 2 * params,
            "activation": 4 * batch * 5 * dim, "largest_weight": 4 * 4 * dim * dim}


def profile_mlp(tmp_path: Path, dim: int, batch: int,
                after_backward: Callable[[torch.nn.Module], None] | None = None,
                ) -> tuple[object, Path, object]:
    """Two profiled steps (after one that creates Adam's state): PyTorch's categorised part, the
    exported trace, and the profiler's raw results.  ``after_backward(model)`` runs between the
    backward pass and the optimizer step."""
    torch.manual_seed(0)
    linear, relu = torch.nn.Linear, torch.nn.ReLU
    model = torch.nn.Sequential(linear(dim, 2 * dim), relu(), linear(2 * dim, 2 * dim), relu(),
                                linear(2 * dim, dim))
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, dim)

    def step() -> None:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        if after_backward is not None:
            after_backward(model)
        optimizer.step()

    step()
    got: dict[str, object] = {}
    trace = tmp_path / "mlp.json"

    def ready(prof: profile) -> None:
        got["part"] = memory_part(prof.profiler.kineto_results)
        got["raw"] = _pytorch_reading(prof.profiler.kineto_results)
        prof.export_chrome_trace(str(trace))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1), on_trace_ready=ready) as prof:
        for _ in range(4):
            step()
            prof.step()
    return got["part"], trace, got["raw"]


def _pytorch_reading(result: object) -> dict[str, int]:
    """A straightforward reading of PyTorch's own timeline (``export_memory_timeline``'s numbers):
    bytes per category at the moment of the highest total."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfile, MemoryProfileTimeline

    _, sizes = MemoryProfileTimeline(MemoryProfile(result))._coalesce_timeline("cpu")
    table = np.array(sizes)
    peak = int(table.sum(axis=1).argmax())
    return {(c.name.lower() if c is not None else "none"): int(table[peak, i + 1])
            for c, i in _CATEGORY_TO_INDEX.items()}


def within(measured: float, truth: float, tolerance: float) -> bool:
    return abs(measured - truth) <= tolerance * truth


def test_pytorch_categories_at_the_peak_equal_the_analytic_sizes(tmp_path: Path) -> None:
    """A small batch: the peak is in the optimizer step (Adam's workspace on top of parameters,
    gradients and state), which is what the model implies; the three persistent categories there
    equal the analytic bytes within 5 %, and PyTorch's straightforward reading counts one tensor the
    size of the largest weight too many as a parameter (Adam's exp_avg_sq.sqrt()), which the
    correction counts as the step's temporary."""
    part, _, raw = profile_mlp(tmp_path, DIM, batch=16)
    truth = analytic(DIM, 16)
    (cpu,) = part.devices
    assert part.source == "pytorch" and cpu.peak.phase == "optimizer", cpu.peak
    for name in ("parameter", "gradient", "optimizer_state"):
        assert within(getattr(cpu.by_category, name), truth[name], 0.05), (name, cpu.by_category)
    over = raw["parameter"] - truth["parameter"]
    assert within(over, truth["largest_weight"], 0.01), (raw, truth)  # the one tensor too many
    assert cpu.by_category.temporary >= truth["largest_weight"]
    assert any("Optimizer.step" in note for note in part.notes)


def test_activations_equal_the_shapes_and_the_peak_is_in_the_backward_pass(tmp_path: Path) -> None:
    """A large batch: activations dominate, the peak comes in the backward pass, and the activations
    the forward pass keeps for it (live when it starts) are the shapes' sum within 20 %."""
    part, _, _ = profile_mlp(tmp_path, DIM, batch=2048)
    truth = analytic(DIM, 2048)
    (cpu,) = part.devices
    assert cpu.peak.phase == "backward", cpu.peak
    for step in cpu.steps:
        assert within(step.activations_for_backward_bytes, truth["activation"], 0.20), (step, truth)
    assert within(cpu.by_category.parameter, truth["parameter"], 0.05)


def test_the_trace_alone_gives_the_same_categories_and_says_what_it_inferred(tmp_path: Path) -> None:
    """Categorised from the exported trace (no profiler results): gradients and activations measured,
    parameters and Adam's state inferred from them (the CPU allocator's totals start at zero when
    recording starts), all within the same tolerances, and the notes say so."""
    pytorch_part, trace, _ = profile_mlp(tmp_path, DIM, batch=16)
    part = trace_memory_part(load_trace(trace, memory_rows=True))
    truth = analytic(DIM, 16)
    (cpu,) = part.devices
    assert part.source == "trace" and cpu.peak.phase == "optimizer"
    for name in ("parameter", "gradient", "optimizer_state"):
        assert within(getattr(cpu.by_category, name), truth[name], 0.05), (name, cpu.by_category)
    assert any("inferred" in note for note in part.notes), part.notes
    big = trace_memory_part(load_trace(profile_mlp(tmp_path, DIM, batch=2048)[1], memory_rows=True))
    for step in big.devices[0].steps:
        assert within(step.activations_for_backward_bytes, analytic(DIM, 2048)["activation"], 0.20), step
    assert pytorch_part.devices[0].peak_bytes >= cpu.peak_bytes  # the trace misses the batch (inputs)


def test_a_peak_between_the_backward_pass_and_the_optimizer_is_said_so(tmp_path: Path) -> None:
    """Gradients flattened into one buffer and copied three times after the backward pass (as a
    gradient all-reduce or clipping over a flat buffer would): the peak is there, in neither the
    forward pass nor the backward pass, and the trace alone counts the copies as the step's
    temporaries, not as activations."""
    def flatten(model: torch.nn.Module) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        copies = flat.repeat(3)
        del flat, copies

    part, trace, _ = profile_mlp(tmp_path, DIM, batch=16, after_backward=flatten)
    assert part.devices[0].peak.phase == "after_backward", part.devices[0].peak
    (cpu,) = trace_memory_part(load_trace(trace, memory_rows=True)).devices
    params = analytic(DIM, 16)["parameter"]
    assert cpu.peak.phase == "after_backward", cpu.peak
    held = cpu.by_category
    assert held.temporary >= 3 * params and held.activation < 0.1 * params, held
