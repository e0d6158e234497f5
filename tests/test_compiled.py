"""Inductor's kernel estimates read into MFU and the roofline, on a real GPU trace made compiled.

No compiled GPU trace is in tests/data, so each test derives one from the real H200 trace
(``gpu_1rank_h200_torchprof_clean``) the way the diagnose tests inject problems: every matrix
product operator (``aten::mm``, ``aten::addmm``) becomes a Triton template launch named as inductor
names them (``triton_tem_fused_mm_0``), its ``Input Dims`` replaced by the ``kernel_flop`` /
``kernel_num_gb`` args inductor writes (torch/_inductor/runtime/triton_heuristics.py,
``get_profiler_kwargs``): the FLOPs of its shapes, the bytes of its bf16 operands; the GELU and
layer-norm operators become pointwise / reduction kernels with ``kernel_flop`` 0, as inductor writes
for them.  The GPU kernels they launch (linked by ``External id``) take the same names.  The MFU
must not change (the same FLOPs, now inductor's), the GELU and layer-norm kernels' time becomes
time with known FLOPs, and each kernel's achieved TFLOP/s and TB/s are its figures over its time.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.gpu_train import parse_flags
from helpers.inject import load_doc, step_starts, write_doc
from helpers.paths import DATA
from helpers.processes import subprocess_env

from torchprof_args import TorchProfiler
from torchprof_args.analysis import load_trace
from torchprof_args.analysis.analyzers.compiled.regions import kernel_roofline
from torchprof_args.analysis.diagnose.context import KindContext
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.diagnose.kinds import low_mfu
from torchprof_args.analysis.render.report import render_report
from torchprof_args.analysis.render.text import format_summary
from torchprof_args.analysis.summary import cross_rank, summarize
from torchprof_args.device_peaks import peak_tbps, peak_tflops

H200 = DATA / "gpu_1rank_h200_torchprof_clean.json.gz"
MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}  # the operands' positions in Input Dims
POINTWISE = {"aten::gelu": "triton_poi_fused_gelu", "aten::gelu_backward": "triton_poi_fused_gelu_backward",
             "aten::native_layer_norm": "triton_per_fused_native_layer_norm"}


class Injected:
    """The derived trace and what was written into it: per kernel name, its FLOPs and GB in the
    steps and the device time of its kernels there."""

    def __init__(self, path: Path, flop: dict[str, float], gb: dict[str, float], dur_us: dict[str, float],
                 pointwise_us: float, steps: int) -> None:
        self.path, self.flop, self.gb, self.dur_us = path, flop, gb, dur_us
        self.pointwise_us, self.steps = pointwise_us, steps


def _compile(doc: dict[str, Any], tmp: Path) -> Injected:
    events = doc["traceEvents"]
    starts = step_starts(doc)
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name", "").startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]
    in_steps = functools.partial(lambda spans, t: any(a <= t < b for a, b in spans), spans)
    names: dict[tuple[str, str], str] = {}
    renamed: dict[Any, str] = {}
    flop: dict[str, float] = defaultdict(float)
    gb: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") != "cpu_op" or (e["name"] not in MATMULS and e["name"] not in POINTWISE):
            continue
        args = e["args"]
        dims = args.pop("Input Dims", None)
        if e["name"] in MATMULS:
            a, b = (dims[i] for i in MATMULS[e["name"]])
            m, k, n = a[0], a[1], b[1]
            name = names.setdefault((e["name"], str(dims)), f"triton_tem_fused_mm_{len(names)}")
            args["kernel_flop"] = 2 * m * k * n
            args["kernel_num_gb"] = 2 * (m * k + k * n + m * n) / 1e9
        else:
            name = POINTWISE[e["name"]]
            args["kernel_flop"] = 0
            args["kernel_num_gb"] = 1e-3
        e["name"] = name
        renamed[args["External id"]] = name
        if in_steps(e["ts"]):
            flop[name] += args["kernel_flop"]
            gb[name] += args["kernel_num_gb"]
    dur_us: dict[str, float] = defaultdict(float)
    pointwise_us = 0.0
    for e in events:
        if e.get("cat") == "kernel" and e["args"].get("External id") in renamed:
            e["name"] = renamed[e["args"]["External id"]]
            if in_steps(e["ts"]):
                dur_us[e["name"]] += e["dur"]
                pointwise_us += e["dur"] if not e["name"].startswith("triton_tem") else 0.0
    assert len(names) >= 4 and len(starts) == 3
    return Injected(write_doc(doc, tmp, "compiled.json"), flop, gb, dur_us, pointwise_us, len(starts))


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory) -> Injected:
    return _compile(load_doc(H200), tmp_path_factory.mktemp("compiled"))


def test_inductor_s_flops_give_the_same_mfu_as_the_shapes(injected: Injected) -> None:
    """The same matrix products counted by inductor instead of from their shapes: the same FLOPs and
    MFU; inductor's share is what was injected; the pointwise kernels' time now has known FLOPs (0)."""
    eager = low_mfu.mfu_inputs(load_trace(H200, flops=True))
    compiled = low_mfu.mfu_inputs(load_trace(injected.path, flops=True))
    assert not isinstance(eager, low_mfu.Gap) and not isinstance(compiled, low_mfu.Gap)
    assert eager.inductor_flops_per_step == 0.0
    assert compiled.flops_per_step == pytest.approx(eager.flops_per_step, rel=1e-9)
    assert compiled.inductor_flops_per_step == pytest.approx(sum(injected.flop.values()) / injected.steps,
                                                             rel=1e-9)
    assert 0 < compiled.inductor_flops_per_step < compiled.flops_per_step  # attention: from its shapes
    assert eager.accounted_ms is not None and compiled.accounted_ms is not None
    gained = compiled.accounted_ms - eager.accounted_ms
    assert gained == pytest.approx(injected.pointwise_us / 1e3 / injected.steps, rel=0.01)
    finding = low_mfu.judge(compiled, KindContext(thresholds_off=True))
    assert isinstance(finding, Finding)
    judged_eager = low_mfu.judge(eager, KindContext(thresholds_off=True))
    assert isinstance(judged_eager, Finding)
    assert finding.evidence["mfu"] == judged_eager.evidence["mfu"]
    share = finding.evidence["inductor_share_of_flops"]
    assert share == pytest.approx(compiled.inductor_flops_per_step / compiled.flops_per_step, abs=1e-4)
    assert {k["name"] for k in finding.evidence["triton_kernels"]} <= set(injected.flop)


def test_triton_kernels_without_inductor_s_flops_ask_for_the_flag(injected: Injected, tmp_path: Path) -> None:
    """The same compiled trace as recorded without ``--torch-profile-with-flops`` (no ``kernel_flop`` /
    ``kernel_num_gb`` on the launches): its Triton kernels' time is time without FLOPs, and the
    finding names the flag that has inductor write them."""
    doc = load_doc(injected.path)
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"].startswith("triton"):
            e["args"].pop("kernel_flop")
            e["args"].pop("kernel_num_gb")
    trace = load_trace(write_doc(doc, tmp_path, "uncounted.json"), flops=True)
    assert len(trace.compiled_args) == 0
    inputs = low_mfu.mfu_inputs(trace)
    assert not isinstance(inputs, low_mfu.Gap)
    assert inputs.inductor_flops_per_step == 0.0
    assert inputs.uncounted_triton_ms == pytest.approx(sum(injected.dur_us.values()) / 1e3 / injected.steps,
                                                       rel=0.01)
    finding = low_mfu.judge(inputs, KindContext(thresholds_off=True))
    assert isinstance(finding, Finding) and "--torch-profile-with-flops" in finding.saving_bound


@pytest.mark.parametrize("workers", [1, 2])
def test_each_kernel_s_roofline_is_its_figures_over_its_time(injected: Injected, workers: int) -> None:
    """Achieved TFLOP/s and TB/s per kernel name are the injected FLOPs and bytes over the kernels'
    device time; the bound and the share of the roof follow from the H200's peaks."""
    trace = load_trace(injected.path, workers=workers)
    kernels, share = kernel_roofline(trace, "NVIDIA H200")
    assert {k.name for k in kernels} == set(injected.dur_us)
    peak_t, peak_b = peak_tflops("NVIDIA H200"), peak_tbps("NVIDIA H200")
    assert peak_t and peak_b
    for k in kernels:
        seconds = injected.dur_us[k.name] / 1e6
        assert k.ms_per_step == pytest.approx(injected.dur_us[k.name] / 1e3 / injected.steps, rel=1e-5)
        assert k.tflops == pytest.approx(injected.flop[k.name] / seconds / 1e12, rel=1e-5)
        assert k.tbps == pytest.approx(injected.gb[k.name] / seconds / 1e3, rel=1e-5)
        intensity = injected.flop[k.name] / (injected.gb[k.name] * 1e9)
        bound = "compute" if intensity >= peak_t / peak_b else "memory"
        assert k.bound == bound, k
        expected = k.tflops / peak_t if bound == "compute" else k.tbps / peak_b
        assert k.of_roof == pytest.approx(expected, rel=1e-9)
    assert share is not None and 0 < share < 1
    assert all(k.gflop is not None and math.isfinite(k.gflop) for k in kernels)


def test_the_loose_decoder_keeps_the_same_compiled_args(injected: Injected, tmp_path: Path) -> None:
    """A batch the typed decoder rejects (an operator's ``stream`` that is no number) is decoded
    loosely: the same compiled args, in one process or two."""
    doc = load_doc(injected.path)
    for e in doc["traceEvents"]:  # every batch with a Triton launch
        if e.get("cat") == "cpu_op" and e["name"].startswith("triton"):
            e["args"]["stream"] = "not a number"
    typed = load_trace(injected.path).compiled_args
    for workers in (1, 2):
        loose = load_trace(write_doc(doc, tmp_path, "loose.json"), workers=workers).compiled_args
        for column in ("idx", "flop", "gb", "seq"):
            assert (getattr(loose, column) == getattr(typed, column)).all(), (workers, column)
    assert len(typed) and (typed.seq >= 0).sum() == 0  # no compiled function in an eager trace


def test_summary_shows_the_roofline(injected: Injected) -> None:
    """``summary`` reads the kernel estimates without the FLOP decoding: its compiled section holds
    every injected kernel against the trace's own device (the H200's peaks), and the text shows it;
    the unmodified trace has no compiled section."""
    summary = summarize(load_trace(injected.path), top=None)
    code = summary.compiled
    assert code is not None and code.device == "NVIDIA H200"
    assert code.peak_tflops == peak_tflops("NVIDIA H200") and code.peak_tbps == peak_tbps("NVIDIA H200")
    assert {k.name for k in code.kernels} == set(injected.dur_us)
    assert code.regions == []  # the eager trace's launches were renamed; no dynamo frame in it
    text = format_summary(summary)
    assert "Triton kernels on the roofline" in text and "triton_tem_fused_mm_" in text
    assert {m for k in code.kernels for m in k.modules} >= {"(backward)", "Linear_0", "LayerNorm_0"}
    assert summarize(load_trace(H200)).compiled is None
    page = render_report([("cycle", [summary], cross_rank([summary]))])
    assert "Compiled code, slowest: rank 0" in page and "% of roof" in page
    assert all(k.name in page for k in code.kernels[:12])


@pytest.mark.slow
@pytest.mark.parametrize("with_flops", [True, False])
def test_with_flops_has_inductor_write_its_kernels_estimates(tmp_path: Path, with_flops: bool) -> None:
    """``--torch-profile-with-flops`` turns inductor's ``benchmark_kernel`` on when profiling starts
    (what makes it write ``kernel_flop`` / ``kernel_num_gb`` into its Triton launches; the CUDA test
    reads them back), and a model compiled under it still trains; without the flag it stays off."""
    import torch._inductor.config as inductor_config

    flags = ["--torch-profile-with-flops"] if with_flops else []
    with inductor_config.patch(benchmark_kernel=False):
        prof = TorchProfiler.from_args(parse_flags(
            "--torch-profile", "--torch-profile-dir", str(tmp_path / "prof"),
            "--no-torch-profile-operator-table", "--torch-profile-active", "1", *flags))
        model = torch.compile(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()))
        with prof:
            assert inductor_config.benchmark_kernel is with_flops
            for iteration in range(1, 4):
                model(torch.randn(4, 16)).sum().backward()
                prof.step(iteration)
        (published,) = prof.published_traces
        assert summarize(load_trace(published)).compiled is not None


def test_with_flops_does_not_import_inductor_for_a_job_that_never_compiles() -> None:
    """In a process where inductor is not loaded yet, the setting is left in its environment
    variable, read when inductor is imported (by the first ``torch.compile``): an eager job with
    ``--torch-profile-with-flops`` never pays inductor's import."""
    code = ("import sys, torch\n"
            "from torchprof_args.capture.runtime.startup import _write_kernel_costs\n"
            "_write_kernel_costs()\n"
            "assert 'torch._inductor.config' not in sys.modules\n"
            "import torch._inductor.config as config\n"
            "print(config.benchmark_kernel)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
