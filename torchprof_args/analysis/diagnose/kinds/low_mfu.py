"""``low_mfu``: model FLOPs per step far below what the GPU could do in the step's time.

MFU = the step's FLOPs / (step time x the device's dense peak).  FLOPs are those of the matrix
products and attention operators, computed from their recorded input shapes
(``--torch-profile-record-shapes``, which ``--torch-profile-with-flops`` turns on too; torch.profiler
writes no FLOP counts into the trace itself: :mod:`~torchprof_args.analysis.decode.op_flops`), the
``flops`` an operator carries where a writer put them there, and for a compiled model the
``kernel_flop`` inductor writes into its Triton kernels' launches (``--torch-profile-with-flops``
has it written: :mod:`~torchprof_args.analysis.analyzers.compiled.regions`; a kernel it gave a count, 0 for
a pointwise one, has known FLOPs); the peak comes from the trace's
``deviceProperties`` name through :mod:`torchprof_args.device_peaks` (bf16 dense by default), or
the context's :class:`~..context.Peak` for a device the table lacks or another data type.  The
trace must be loaded with ``load_trace(..., flops=True)`` (the summary does not decode them, so it
stays as fast).  The
saving is bounded by the step time at :data:`TARGET_MFU` (what well-tuned large-scale LLM
training reaches).  Low MFU is the sum of every inefficiency, so the kind runs last among the
per-rank kinds (the registry's order) and saves only what the findings before it leave.
"""

from __future__ import annotations

import numpy as np

from torchprof_args.analysis.analyzers.compiled.regions import kernel_launchers, kernel_roofline
from torchprof_args.analysis.analyzers.cpu_ops import cpu_tree
from torchprof_args.analysis.analyzers.gpu import COMPUTATION, kernel_type
from torchprof_args.analysis.analyzers.origin import device_name
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.analysis.critical_path.cpu_graph import inherit
from torchprof_args.analysis.diagnose.context import DEFAULT_CONTEXT, KindContext, Scope
from torchprof_args.analysis.diagnose.documents import MfuInputs
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
from torchprof_args.analysis.trace import Trace
from torchprof_args.device_peaks import peak_tflops as table_peak

__all__ = ["CPU_DEVICE", "FLOPS_FLAG", "KIND", "KNOWN_SHARE", "SCOPE", "TARGET_MFU", "THRESHOLD", "analyze",
           "compute_accounted", "inductor_flops", "judge", "mfu_inputs", "step_flops",
           "uncounted_triton_us"]

KIND = "low_mfu"
SCOPE = Scope.PER_RANK
#: the step's time beyond what its FLOPs take at peak (1 - MFU) must reach 70 % of the step: an MFU
#: of 30 % or less.
THRESHOLD = Threshold(share_of_step=0.70)
#: the MFU the saving is computed against.
TARGET_MFU = 0.40
#: below this share of the GPU's compute time launched by operators with a FLOP count, the finding
#: says how much is unaccounted and claims no saving from it.
KNOWN_SHARE = 0.9
#: Triton kernels on the roofline in the finding's evidence (the most device time first).
ROOFLINE_KERNELS = 5
#: the flag that has inductor write its Triton kernels' FLOPs into the trace.
WITH_FLOPS_FLAG = "--torch-profile-with-flops"
#: the flag that records what FLOPs are computed from (operator input shapes).
FLOPS_FLAG = "--torch-profile-record-shapes"
REMEDY = ("raise the arithmetic intensity: bf16/fp8, larger micro-batches, fused kernels (FlashAttention, "
          "torch.compile), fewer recomputations; fix the larger findings above first")


#: the device of a trace without GPU kernels: its MFU is the CPU's, against ``--peak-tflops`` only.
CPU_DEVICE = "CPU"


def step_flops(trace: Trace) -> float | None:
    """FLOPs in the steps, from the operators' shapes or ``flops`` (None when the trace has none)."""
    flops = trace.flops
    if flops is None or len(flops[0]) == 0:
        return None
    ctx = context(trace)
    idx, values = flops
    inside = (trace.ts[idx] >= ctx.start) & (trace.ts[idx] < ctx.end)
    return float(values[inside].sum())


def compute_accounted(trace: Trace) -> tuple[float, float]:
    """(computation kernel time, the part of it launched under an operator with a FLOP count), in
    us over the steps: how much of the GPU's compute the FLOPs account for."""
    ctx = context(trace)
    is_comp = lookup(trace.names, lambda n: kernel_type(n) == COMPUTATION)[trace.name_id[ctx.kernels]]
    busy = ctx.k_end - ctx.k_ts
    total = float(busy[is_comp].sum())
    if trace.flops is None or not (len(trace.flops[0]) or len(trace.compiled_args)) or not total:
        return total, 0.0
    tree = cpu_tree(trace)
    position = np.full(len(trace.ts) + 1, -1, dtype=np.int64)
    position[tree["idx"]] = np.arange(len(tree["idx"]), dtype=np.int64)
    counted = np.zeros(len(tree["idx"]), dtype=bool)
    costs = trace.compiled_args
    found = position[np.r_[trace.flops[0], costs.idx[costs.flop >= 0]]]
    counted[found[found >= 0]] = True
    under = inherit(counted, tree["parent"].astype(np.int64), tree["depth"].astype(np.int64))
    launch = position[np.where(ctx.launch >= 0, ctx.launch, -1)]
    accounted = is_comp & (launch >= 0) & under[np.maximum(launch, 0)]
    return total, float(busy[accounted].sum())


def uncounted_triton_us(trace: Trace) -> float:
    """Kernel time (us, over the steps) in Triton kernels whose launch carries no ``kernel_flop``:
    a compiled model whose kernels inductor generated without ``benchmark_kernel``."""
    ctx = context(trace)
    triton = lookup(trace.names, lambda n: n.startswith("triton"))[trace.name_id[ctx.kernels]]
    if not triton.any():
        return 0.0
    rows = kernel_launchers(trace, ctx.launch)
    counted = rows >= 0
    counted[counted] = trace.compiled_args.flop[rows[counted]] >= 0
    return float((ctx.k_end - ctx.k_ts)[triton & ~counted].sum())


def inductor_flops(trace: Trace) -> float:
    """The FLOPs inductor wrote into its Triton kernels' launches in the steps (``kernel_flop``)."""
    costs = trace.compiled_args
    if not len(costs):
        return 0.0
    ctx = context(trace)
    inside = (trace.ts[costs.idx] >= ctx.start) & (trace.ts[costs.idx] < ctx.end)
    return float(np.maximum(costs.flop[inside], 0).sum())


def mfu_inputs(trace: Trace) -> MfuInputs | Gap:
    """What MFU needs from one rank's trace, kept in the sidecar so ``diagnose`` judges
    it (once, against the peak asked for) without the trace; a Gap when the trace cannot give it."""
    ctx = context(trace)
    if trace.flops is None:
        return Gap(KIND, "the trace was loaded without its FLOP counts (load_trace(..., flops=True))")
    total = step_flops(trace)
    if total is None:
        return Gap(KIND, "the trace has no operator shapes to count FLOPs from", FLOPS_FLAG)
    evidence = {**ctx.evidence(), "perfetto_ts_us": round(ctx.longest_step_ts, 3)}
    per_step = total / ctx.n_steps
    if not ctx.has_gpu:  # a CPU job: judged against the peak --peak-tflops gives
        return MfuInputs(rank=trace.rank or 0, flops_per_step=per_step, step_ms=ctx.step_us / 1000.0,
                         device=CPU_DEVICE, step_evidence=evidence)
    compute_us, accounted_us = compute_accounted(trace)
    return MfuInputs(rank=trace.rank or 0, flops_per_step=per_step, step_ms=ctx.step_us / 1000.0,
                     device=device_name(trace), step_evidence=evidence,
                     compute_ms=ctx.ms(compute_us), accounted_ms=ctx.ms(accounted_us),
                     inductor_flops_per_step=inductor_flops(trace) / ctx.n_steps,
                     uncounted_triton_ms=ctx.ms(uncounted_triton_us(trace)),
                     kernels=kernel_roofline(trace, device_name(trace))[0][:ROOFLINE_KERNELS])


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def judge(inputs: MfuInputs, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The MFU of :func:`mfu_inputs` against the context's peak (default: the device table's bf16).

    Low MFU is the sum of every inefficiency, the earlier findings' included, so its saving is what
    is left after what they save (no time is counted twice); the finding stays, with its MFU, when
    nothing is left.

    Args:
        inputs: one rank's :class:`MfuInputs`.
        kind_ctx: the peak, the rank's earlier findings, the thresholds.

    Returns:
        The finding; a gap when the peak is unknown; None at an MFU above :data:`THRESHOLD`'s.
    """
    name, dtype = inputs.device, kind_ctx.peak.dtype
    peak = kind_ctx.peak.tflops or (table_peak(name, dtype) if name and name != CPU_DEVICE else None)
    if not peak and name == CPU_DEVICE:
        return Gap(KIND, "a CPU job (no GPU kernels in the trace): a CPU's peak is not in the table; give it "
                         "(all the rank's cores, in the dtype it computes in) to judge MFU", "--peak-tflops")
    if not peak:
        return Gap(KIND, f"the {dtype} peak of device {name!r} is not in the table", "--peak-tflops")
    flops, step_ms = inputs.flops_per_step, inputs.step_ms
    mfu = flops / (step_ms / 1e3 * peak * 1e12) if step_ms > 0 else 0.0
    ideal_ms = flops / (peak * 1e12) * 1e3
    ms = step_ms - ideal_ms
    if not kind_ctx.threshold(THRESHOLD).reached(ms, ms / step_ms if step_ms else 0.0):
        return None
    others_ms = min(max(0.0, kind_ctx.earlier_saving_ms()), step_ms)
    saving = max(0.0, step_ms - ideal_ms / TARGET_MFU - others_ms)
    bound = f"step time at {100 * TARGET_MFU:.0f} % MFU"
    if others_ms > 0:
        bound += f", less the {others_ms:.1f} ms/step the other findings save"
    evidence = {**inputs.step_evidence, "mfu": round(mfu, 4), "tflops_per_step": round(flops / 1e12, 3),
                "achieved_tflops": round(flops / step_ms * 1e3 / 1e12, 2) if step_ms > 0 else None,
                "peak_tflops": peak, "device": name, "dtype": dtype, "target_mfu": TARGET_MFU}
    if inputs.inductor_flops_per_step > 0 and flops > 0:
        evidence["inductor_share_of_flops"] = round(inputs.inductor_flops_per_step / flops, 4)
    if inputs.kernels:  # where the compiled kernels sit under their roofs (of_roof: 1 = on it)
        evidence["triton_kernels"] = [
            {"name": k.name, "ms_per_step": round(k.ms_per_step, 3), "tflops": _round(k.tflops, 2),
             "tbps": _round(k.tbps, 3), "bound": k.bound, "of_roof": _round(k.of_roof, 3)}
            for k in inputs.kernels]
    summary = f"model FLOPs use {100 * mfu:.1f} % of the {name or 'GPU'}'s {peak:g} TFLOP/s peak"
    compute, known = inputs.compute_ms, inputs.accounted_ms
    if compute and known is not None and known < KNOWN_SHARE * compute:
        # FLOPs known for part of the compute only: claim nothing from the part without them
        saving = max(0.0, min(saving, known - ideal_ms / TARGET_MFU))
        evidence.update(flops_known_share=round(known / compute, 4),
                        unaccounted_compute_ms_per_step=round(compute - known, 3))
        bound += (f"; FLOPs are known for {100 * known / compute:.0f} % of the GPU's compute time only: "
                  f"no saving is claimed from the {compute - known:.1f} ms/step without them")
        if inputs.uncounted_triton_ms > 0:
            evidence["uncounted_triton_ms_per_step"] = round(inputs.uncounted_triton_ms, 3)
            bound += (f" ({inputs.uncounted_triton_ms:.1f} ms/step in compiled Triton kernels: "
                      f"{WITH_FLOPS_FLAG} has inductor write their FLOPs into the trace)")
        summary = (f"model FLOPs known for {100 * known / compute:.0f} % of the GPU's compute time "
                   f"({compute - known:.1f} ms/step unaccounted) use {100 * mfu:.2f} % of the "
                   f"{name or 'GPU'}'s {peak:g} TFLOP/s peak: MFU is at least that")
    return Finding(
        kind=KIND, ranks=(inputs.rank,),
        summary=summary,
        ms_per_step=ms, share_of_step=ms / step_ms if step_ms else 0.0,
        saving_ms_per_step=saving, saving_bound=bound,
        remedy=REMEDY, evidence=evidence)


def analyze(trace: Trace, kind_ctx: KindContext = DEFAULT_CONTEXT) -> Finding | Gap | None:
    """The step's MFU against the device's peak.

    Args:
        trace: one rank's trace, loaded with ``flops=True``.
        kind_ctx: the peak, the rank's earlier findings (see :func:`judge`), the thresholds.

    Returns:
        The finding; a gap when the trace or the table cannot give the MFU; None at an MFU above
        :data:`THRESHOLD`'s.
    """
    inputs = mfu_inputs(trace)
    return inputs if isinstance(inputs, Gap) else judge(inputs, kind_ctx)
