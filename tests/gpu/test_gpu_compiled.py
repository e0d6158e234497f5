"""A compiled model's MFU from inductor's own FLOPs, on CUDA: ``--torch-profile-with-flops`` has
inductor write ``kernel_flop`` / ``kernel_num_gb`` into its Triton kernels' launches (its
``benchmark_kernel`` setting), and ``low_mfu`` and the summary's roofline read them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from helpers.cuda import requires_gpus
from helpers.gpu_train import parse_flags
from torch import nn

from torchprof_args import TorchProfiler
from torchprof_args.analysis import load_trace, summarize
from torchprof_args.analysis.diagnose.context import KindContext
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.diagnose.kinds import low_mfu

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1)]

DIM, LAYERS, BATCH = 2048, 4, 4096
#: forward 2 B D^2 per layer, backward twice that (the input's and the weight's gradients) but for
#: the first layer's input gradient (its input needs none).
FLOPS_PER_STEP = 2 * BATCH * DIM * DIM * (3 * LAYERS - 1)


def _model() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(DIM, DIM, bias=False), nn.ReLU()]
    return nn.Sequential(*layers).cuda().to(torch.bfloat16)


def _compiled(model: nn.Module) -> nn.Module:
    """Matrix products as inductor's Triton templates (its FLOPs), not cuBLAS calls (their shapes')."""
    return torch.compile(model, options={"max_autotune": True, "max_autotune_gemm_backends": "TRITON"})


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).float().square().mean().backward()


@pytest.mark.timeout(900)
def test_mfu_of_a_compiled_model_comes_from_inductor_s_flops(tmp_path: Path) -> None:
    """Steps 4-5 of a compiled 4-layer MLP: the trace's FLOPs per step are the model's
    (:data:`FLOPS_PER_STEP`, within 2 %), nearly all of them inductor's ``kernel_flop``; ``low_mfu``
    judges that MFU and the summary puts the Triton kernels on the roofline."""
    torch._dynamo.reset()
    prof = TorchProfiler.from_args(parse_flags(
        "--torch-profile", "--torch-profile-dir", str(tmp_path / "prof"), "--torch-profile-with-flops",
        "--torch-profile-activities", "cpu", "cuda", "--torch-profile-skip-first", "3",
        "--torch-profile-warmup", "0", "--torch-profile-active", "2"))
    model = _compiled(_model())
    x = torch.randn(BATCH, DIM, device="cuda", dtype=torch.bfloat16)
    with prof:  # started before the first call: inductor generates its kernels with their costs
        for iteration in range(1, 7):
            _step(model, x)
            prof.step(iteration)
    (published,) = prof.published_traces
    trace = load_trace(published, flops=True)
    assert len(trace.compiled_args), "inductor wrote no kernel_flop / kernel_num_gb"
    inputs = low_mfu.mfu_inputs(trace)
    assert not isinstance(inputs, low_mfu.Gap), inputs
    assert inputs.flops_per_step == pytest.approx(FLOPS_PER_STEP, rel=0.02)
    assert inputs.inductor_flops_per_step >= 0.9 * inputs.flops_per_step, inputs
    finding = low_mfu.judge(inputs, KindContext(thresholds_off=True))
    assert isinstance(finding, Finding) and finding.evidence["mfu"] > 0
    assert finding.evidence["inductor_share_of_flops"] >= 0.9
    compiled = summarize(trace).compiled
    assert compiled is not None and compiled.kernels and compiled.peak_tflops
    assert any(k.bound == "compute" and k.tflops for k in compiled.kernels), compiled.kernels
    print(f"MFU {finding.evidence['mfu']:.3f} from inductor's FLOPs "
          f"({finding.evidence['inductor_share_of_flops']:.1%} of them); "
          f"kernels: {[(k.name, k.tflops, k.of_roof) for k in compiled.kernels[:3]]}")


@pytest.mark.timeout(900)
def test_what_benchmark_compiled_args() -> None:
    """Inductor's ``benchmark_kernel`` (what the flag sets) costs compile time only: the same model
    compiled without and with it (caches off) runs its steps as fast (within 10 %); both compile
    times are printed (the figure the docs lack: no GPU was lent when this was written)."""
    import torch._inductor.config as inductor_config

    x = torch.randn(BATCH, DIM, device="cuda", dtype=torch.bfloat16)
    timings = {}
    for setting in (False, True):
        torch._dynamo.reset()
        with inductor_config.patch(benchmark_kernel=setting, force_disable_caches=True):
            model = _compiled(_model())
            start = time.perf_counter()
            _step(model, x)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - start
            for _ in range(3):
                _step(model, x)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(20):
                _step(model, x)
            torch.cuda.synchronize()
            timings[setting] = (compile_s, (time.perf_counter() - start) / 20)
    (off_s, off_step), (on_s, on_step) = timings[False], timings[True]
    print(f"compile s / step ms without benchmark_kernel {off_s:.1f} / {off_step * 1e3:.2f}, "
          f"with {on_s:.1f} / {on_step * 1e3:.2f}")
    assert timings[True][1] <= 1.1 * timings[False][1], timings
