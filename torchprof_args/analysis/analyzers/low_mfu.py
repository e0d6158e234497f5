"""``low_mfu``: model FLOPs per step far below what the GPU could do in the step's time.

MFU = the step's FLOPs / (step time x the device's dense peak).  FLOPs are the ``flops`` the
trace's operators carry (recorded with ``--torch-profile-with-flops``: matrix multiplications and
convolutions, which are nearly all of a transformer's FLOPs); the peak comes from the trace's
``deviceProperties`` name through :mod:`torchprof_args.device_peaks` (bf16 dense by default), or
the caller's ``peak_tflops`` for a device the table lacks.  The trace must be loaded with
``load_trace(..., flops=True)`` (the summary does not decode them, so it stays as fast).  The
saving is bounded by the step time at :data:`TARGET_MFU` (what well-tuned large-scale LLM
training reaches).
"""

from __future__ import annotations

from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.analysis.findings import Finding, Gap
from torchprof_args.analysis.trace import Trace
from torchprof_args.device_peaks import peak_tflops as table_peak

__all__ = ["FLOPS_FLAG", "TARGET_MFU", "THRESHOLD", "analyze", "device_name", "step_flops"]

#: at or above this MFU, no finding.
THRESHOLD = 0.30
#: the MFU the saving is computed against.
TARGET_MFU = 0.40
FLOPS_FLAG = "--torch-profile-with-flops"
REMEDY = ("raise the arithmetic intensity: bf16/fp8, larger micro-batches, fused kernels (FlashAttention, "
          "torch.compile), fewer recomputations; fix the larger findings above first")


def device_name(trace: Trace) -> str | None:
    """The trace's GPU name (``deviceProperties``), None when it has none."""
    props = trace.metadata.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        name = props[0].get("name")
        return name if isinstance(name, str) else None
    return None


def step_flops(trace: Trace) -> float | None:
    """FLOPs in the steps, from the operators' ``flops`` (None when the trace has none)."""
    flops = trace.flops
    if flops is None or len(flops[0]) == 0:
        return None
    ctx = context(trace)
    idx, values = flops
    inside = (trace.ts[idx] >= ctx.start) & (trace.ts[idx] < ctx.end)
    return float(values[inside].sum())


def analyze(trace: Trace, peak_tflops: float | None = None, dtype: str = "bf16",
            threshold: float = THRESHOLD) -> Finding | Gap | None:
    """The step's MFU against the device's peak; None at or above ``threshold``."""
    ctx = context(trace)
    if not ctx.has_gpu:
        return Gap("low_mfu", "the trace has no GPU kernels, so there is no GPU peak to compare with",
                   "--torch-profile-activities cpu cuda")
    if trace.flops is None:
        return Gap("low_mfu", "the trace was loaded without its FLOP counts (load_trace(..., flops=True))")
    total = step_flops(trace)
    if total is None:
        return Gap("low_mfu", "the trace has no FLOP counts (they need shapes: with_flops records them "
                              "only with record_shapes)", FLOPS_FLAG)
    name = device_name(trace)
    peak = peak_tflops or (table_peak(name, dtype) if name else None)
    if not peak:
        return Gap("low_mfu", f"the peak of device {name!r} is unknown (pass peak_tflops)", None)
    step_s = ctx.step_us / 1e6
    flops = total / ctx.n_steps
    mfu = flops / (step_s * peak * 1e12) if step_s > 0 else 0.0
    if mfu >= threshold:
        return None
    ideal_ms = flops / (peak * 1e12) * 1e3
    ms = ctx.step_us / 1000.0 - ideal_ms
    saving = max(0.0, ctx.step_us / 1000.0 - ideal_ms / TARGET_MFU)
    evidence = {**ctx.evidence(), "mfu": round(mfu, 4), "tflops_per_step": round(flops / 1e12, 3),
                "achieved_tflops": round(flops / step_s / 1e12, 2) if step_s > 0 else None,
                "peak_tflops": peak, "device": name, "dtype": dtype, "target_mfu": TARGET_MFU,
                "perfetto_ts_us": round(ctx.longest_step_ts, 3)}
    return Finding(
        kind="low_mfu", ranks=(trace.rank or 0,),
        summary=f"model FLOPs use {100 * mfu:.1f} % of the {name or 'GPU'}'s {peak:g} TFLOP/s peak",
        ms_per_step=ms, share_of_step=ms / (ctx.step_us / 1000.0) if ctx.step_us else 0.0,
        saving_ms_per_step=saving, saving_bound=f"step time at {100 * TARGET_MFU:.0f} % MFU",
        remedy=REMEDY, evidence=evidence)
