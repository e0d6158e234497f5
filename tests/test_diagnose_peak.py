"""``torchprof diagnose --peak-tflops / --peak-dtype``: low_mfu judged again against another peak,
from the stored MFU inputs (a sidecar's diagnosis used the table's bf16 peak)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.inject import load_doc, write_doc
from helpers.paths import DATA

from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.diagnose.job_findings import diagnose
from torchprof_args.analysis.diagnose.kinds.low_mfu import step_flops
from torchprof_args.analysis.diagnose.rank import rank_diagnosis
from torchprof_args.analysis.jsonout import finite
from torchprof_args.console import main as torchprof

SAMPLED = DATA / "gpu_128rank_sampled_rank0.json.gz"


def _trace_at_mfu(tmp_path: Path, mfu: float, device: str) -> Path:
    """The real sampled trace with FLOP counts on its matrix products giving ``mfu`` of an H100's
    989.4 TFLOP/s, its device named ``device``."""
    ctx = context(load_trace(SAMPLED))
    doc = load_doc(SAMPLED)
    doc["deviceProperties"] = [{"id": 0, "name": device}]
    mms = [e for e in doc["traceEvents"] if e.get("name") in ("aten::mm", "aten::addmm", "aten::bmm")
           and ctx.start <= e["ts"] < ctx.end]
    for e in mms:
        e["args"]["flops"] = int(mfu * ctx.step_us / 1e6 * 989.4e12 * ctx.n_steps / len(mms))
    return write_doc(doc, tmp_path)


def _low_mfu(doc: dict) -> dict | None:
    return next((f for f in doc["findings"] if f["kind"] == "low_mfu"), None)


def test_an_unknown_device_names_the_flag_and_the_override_finds_low_mfu(tmp_path):
    path = _trace_at_mfu(tmp_path, 0.05, "NVIDIA Future GPU")
    rank_doc = rank_diagnosis(load_trace(path, comms=True, flops=True))
    plain = finite(diagnose([rank_doc], path))
    assert _low_mfu(plain) is None
    assert [g["flag"] for g in plain["gaps"] if g["kind"] == "low_mfu"] == ["--peak-tflops"]
    judged = finite(diagnose([rank_doc], path, peak_tflops=989.4))
    finding = _low_mfu(judged)
    assert finding is not None and finding["evidence"]["mfu"] == pytest.approx(0.05, rel=0.01)
    assert not [g for g in judged["gaps"] if g["kind"] == "low_mfu"]


def test_fp8_peak_halves_the_mfu_through_the_command(tmp_path, capsys):
    path = _trace_at_mfu(tmp_path, 0.5, "NVIDIA H100 80GB HBM3")  # 50 % of bf16: no finding

    def low_mfu(*extra: str) -> dict | None:
        assert torchprof(["diagnose", str(path), "--json", "--no-progress", *extra]) == 0
        return _low_mfu(json.loads(capsys.readouterr().out))

    assert low_mfu() is None
    fp8 = low_mfu("--peak-dtype", "fp8")  # 25 % of the fp8 peak: below the 30 % threshold
    assert fp8["evidence"]["mfu"] == pytest.approx(0.25, rel=0.01) and fp8["evidence"]["dtype"] == "fp8"
    with pytest.raises(SystemExit) as bad:
        torchprof(["diagnose", str(path), "--peak-tflops", "-3"])
    assert bad.value.code == 2 and "--peak-tflops: must be > 0" in capsys.readouterr().err


def test_a_cpu_job_s_mfu_is_judged_against_the_peak_given() -> None:
    """A CPU trace (no GPU kernels) with its FLOPs: without a peak, the gap names --peak-tflops (not
    the GPU activity flag: no use on a CPU job); with one, its MFU is FLOPs per step over the peak."""
    trace = load_trace(DATA / "cpu_2rank_manual_dp_rank0.json.gz", comms=True, flops=True)
    rank_doc = rank_diagnosis(trace)
    plain = finite(diagnose([rank_doc], trace.path))
    (gap,) = [g for g in plain["gaps"] if g["kind"] == "low_mfu"]
    assert gap["flag"] == "--peak-tflops" and "CPU job" in gap["reason"]
    ctx = context(trace)
    flops = step_flops(trace)
    assert flops
    peak = flops / ctx.n_steps / (ctx.step_us / 1e6) / 1e12 / 0.02  # a peak the job uses 2 % of
    finding = _low_mfu(finite(diagnose([rank_doc], trace.path, peak_tflops=peak)))
    assert finding is not None and finding["evidence"]["device"] == "CPU"
    assert finding["evidence"]["mfu"] == pytest.approx(0.02, rel=0.01)
