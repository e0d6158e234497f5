"""Each per-rank diagnose kind finds a problem injected into a copy of a real GPU trace.

For every kind: the unmodified trace gives no finding of that kind above its documented
threshold (no false positive); the injected copy gives the finding with the injected magnitude
(within 10 %) and it ranks first by ``saving_ms_per_step`` among the per-rank kinds.  The
injected magnitude is 1.5 times the largest saving the unmodified trace already shows (real
traces have real problems: GPU idle, exposed communication), so "ranks first" is a real test.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from helpers.inject import (
    add_event,
    cpu_thread,
    device_event,
    gpu_stream,
    insert_pause,
    load_doc,
    new_correlation,
    runtime_call,
    step_starts,
    write_doc,
)
from helpers.paths import DATA

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.analyzers.stepwise import context, host_wait
from torchprof_args.analysis.decode.op_flops import FLOP_OPS
from torchprof_args.analysis.diagnose.context import KindContext
from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.diagnose.kinds import (
    dataloader_stall,
    exposed_comm,
    gpu_idle,
    host_sync,
    launch_bound,
    low_mfu,
    memcpy,
)
from torchprof_args.analysis.diagnose.rank import rank_findings
from torchprof_args.analysis.diagnose.registry import PER_RANK

#: every measurement, whatever its size (the size the unmodified trace already shows).
ALL_SIZES = KindContext(thresholds_off=True)
SAMPLED = DATA / "gpu_128rank_sampled_rank0.json.gz"  # 2 steps, 4.9k events: fast
NCCL = DATA / "gpu_2rank_nccl_rank0.json.gz"  # 3 steps, 40k events
ROCM = DATA / "rocm_mi250_1rank_minitoy.json.gz"


def _findings(path: Path) -> dict[str, Finding]:
    return {f.kind: f for f in rank_findings(load_trace(path, flops=True)) if isinstance(f, Finding)}


@functools.cache
def _magnitude_us(path: Path) -> float:
    """1.5 x the largest per-step saving of the unmodified trace, in us (at least 5 ms)."""
    savings = [f.saving_ms_per_step for f in _findings(path).values()]
    return max(5.0, 1.5 * max(savings, default=0.0)) * 1000.0


@functools.cache
def _first_busy_start(path: Path, after: str = "any") -> list[float]:
    """Per step, the start of the GPU's first busy period inside it (after a host-wait gap with
    ``after="host_wait"``, after a short non-host-wait gap with ``after="kernel_wait"``)."""
    trace = load_trace(path)
    ctx = context(trace)
    wait, _ = host_wait(trace, ctx)
    ends = ctx.idle[1]
    if after == "host_wait":
        ends = ends[wait]
    elif after == "kernel_wait":
        ends = ends[~wait]
    steps = [(s["start_us"], s["start_us"] + s["dur_us"]) for s in _steps(trace)]
    out = []
    for lo, hi in steps:
        inside = ends[(ends > lo + 1.0) & (ends < hi)]
        if len(inside):
            out.append(float(inside[0]))
    return out


def _steps(trace):
    from torchprof_args.analysis.analyzers.steps import steps

    return steps(trace)


def _check(path: Path, kind: str, expected_ms: float, expected_saving: float | None = None) -> Finding:
    found = _findings(path)
    assert kind in found, sorted(found)
    finding = found[kind]
    assert finding.ms_per_step == pytest.approx(expected_ms, rel=0.10)
    saving = expected_ms if expected_saving is None else expected_saving
    assert finding.saving_ms_per_step == pytest.approx(saving, rel=0.10)
    ranked = sorted(found.values(), key=lambda f: -f.saving_ms_per_step)
    assert ranked[0].kind == kind, [(f.kind, round(f.saving_ms_per_step, 1)) for f in ranked]
    assert finding.evidence["perfetto_ts_us"] is not None
    return finding


def test_no_false_positives_on_the_unmodified_traces() -> None:
    assert dataloader_stall.analyze(load_trace(SAMPLED)) is None
    assert host_sync.analyze(load_trace(SAMPLED)) is None
    assert memcpy.analyze(load_trace(SAMPLED)) is None
    assert launch_bound.analyze(load_trace(SAMPLED)) is None
    assert exposed_comm.analyze(load_trace(ROCM)) is None


def test_dataloader_stall_found_with_its_magnitude(tmp_path: Path) -> None:
    doc = load_doc(SAMPLED)
    pid, tid = cpu_thread(doc)
    d = _magnitude_us(SAMPLED)
    starts = step_starts(doc)
    for t in reversed(starts):
        insert_pause(doc, t, d, cause={"name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                                       "cat": "user_annotation", "pid": pid, "tid": tid})
    finding = _check(write_doc(doc, tmp_path), "dataloader_stall", d / 1000.0)
    assert finding.evidence["fetches_per_step"] == 1.0


def test_host_sync_found_with_its_call_site(tmp_path: Path) -> None:
    doc = load_doc(SAMPLED)
    pid, tid = cpu_thread(doc)
    d = _magnitude_us(SAMPLED)
    for t in reversed(_first_busy_start(SAMPLED)):
        insert_pause(doc, t, d, cause=runtime_call("cudaStreamSynchronize", pid, tid, new_correlation(doc)))
        add_event(doc, {"name": "train.py(42): train_step", "cat": "python_function", "pid": pid, "tid": tid,
                        "ts": t - 2.0, "dur": d + 4.0})
        add_event(doc, {"name": "<built-in method item of Tensor object at 0x7f0>", "cat": "python_function",
                        "pid": pid, "tid": tid, "ts": t - 1.0, "dur": d + 2.0})
    finding = _check(write_doc(doc, tmp_path), "host_sync", d / 1000.0)
    assert finding.evidence["call_sites"][0]["name"] == "train.py(42): train_step"
    assert "train.py(42): train_step" in finding.remedy


def test_host_sync_without_stacks_names_the_flag(tmp_path: Path) -> None:
    doc = load_doc(SAMPLED)
    pid, tid = cpu_thread(doc)
    d = _magnitude_us(SAMPLED)
    for t in reversed(_first_busy_start(SAMPLED)):
        insert_pause(doc, t, d, cause=runtime_call("cudaDeviceSynchronize", pid, tid, new_correlation(doc)))
    finding = _check(write_doc(doc, tmp_path), "host_sync", d / 1000.0)
    assert finding.evidence["call_sites_need"] == "--torch-profile-with-stack"


@pytest.mark.slow
def test_memcpy_found_with_its_magnitude(tmp_path: Path) -> None:
    base = memcpy.analyze(load_trace(SAMPLED), ALL_SIZES)
    assert isinstance(base, Finding)
    doc = load_doc(SAMPLED)
    pid, tid = cpu_thread(doc)
    kernel = gpu_stream(doc)
    d = _magnitude_us(SAMPLED)
    starts = _first_busy_start(SAMPLED)
    for t in reversed(starts):
        corr = new_correlation(doc)
        insert_pause(doc, t, d, cause=runtime_call("cudaMemcpyAsync", pid, tid, corr))
        add_event(doc, device_event("Memcpy DtoH (Device -> Pageable)", kernel, corr, t, d, cat="gpu_memcpy"))
    expected = base.ms_per_step + d / 1000.0 * len(starts) / 2
    finding = _check(write_doc(doc, tmp_path), "memcpy", expected)
    assert finding.evidence["pageable_ms_per_step"] >= d / 1000.0 * len(starts) / 2


@pytest.mark.slow
def test_launch_bound_found_with_its_magnitude(tmp_path: Path) -> None:
    """An unfused loop of tiny kernels, each launched after 200 us of Python: the GPU waits."""
    base = launch_bound.analyze(load_trace(SAMPLED), ALL_SIZES)
    assert isinstance(base, Finding)
    doc = load_doc(SAMPLED)
    pid, tid = cpu_thread(doc)
    kernel = gpu_stream(doc)
    python_us, launch_us, kernel_us = 200.0, 10.0, 2.0
    n = int(_magnitude_us(SAMPLED) / (python_us + launch_us - kernel_us)) + 1
    starts = _first_busy_start(SAMPLED, after="host_wait")
    for t in reversed(starts):
        insert_pause(doc, t, n * (python_us + launch_us))
        first = new_correlation(doc)
        for i in range(n):
            op, corr = t + i * (python_us + launch_us), first + i
            add_event(doc, {"name": "aten::add_", "cat": "cpu_op", "pid": pid, "tid": tid, "ts": op,
                            "dur": python_us + launch_us})
            add_event(doc, runtime_call("cudaLaunchKernel", pid, tid, corr, ts=op + python_us, dur=launch_us))
            add_event(doc, device_event("void at::native::vectorized_elementwise_kernel<4>", kernel, corr,
                                        op + python_us + launch_us + 1.0, kernel_us))
    added_us = n * (python_us + launch_us - kernel_us) * len(starts)
    finding = _check(write_doc(doc, tmp_path), "launch_bound", base.ms_per_step + added_us / 1000.0 / 2)
    assert finding.evidence["short_kernels_share"] > 0.5


@pytest.mark.slow
def test_gpu_idle_found_with_its_magnitude(tmp_path: Path) -> None:
    """The GPU waits on something no CPU activity explains (e.g. an event from another stream)."""
    base = gpu_idle.analyze(load_trace(NCCL), ALL_SIZES)
    assert gpu_idle.analyze(load_trace(NCCL)) is None and isinstance(base, Finding)
    doc = load_doc(NCCL)
    d = _magnitude_us(NCCL)
    starts = _first_busy_start(NCCL, after="kernel_wait")
    for t in reversed(starts):
        insert_pause(doc, t, d)
    added = d / 1000.0 * len(starts) / 3
    path = write_doc(doc, tmp_path)
    finding = _check(path, "gpu_idle", base.ms_per_step + added, base.saving_ms_per_step + added)
    assert finding.evidence["breakdown_ms_per_step"]["other"] >= d / 1000.0 * len(starts) / 3


def test_exposed_comm_found_on_rocm(tmp_path: Path) -> None:
    """An RCCL kernel no computation overlaps, on an AMD MI250 trace (HIP kernels)."""
    doc = load_doc(ROCM)
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    n_steps = context(load_trace(ROCM)).n_steps
    d = _magnitude_us(ROCM) * n_steps  # injected once: the mean step gets 1 / n_steps of it
    t = _first_busy_start(ROCM)[0]
    corr = new_correlation(doc)
    pid, tid = cpu_thread(doc)
    insert_pause(doc, t, d, cause=runtime_call("hipExtLaunchKernel", pid, tid, corr))
    add_event(doc, device_event("ncclDevKernel_Generic(ncclDevKernelArgsStorage)", kernel, corr, t, d))
    finding = _check(write_doc(doc, tmp_path), "exposed_comm", d / 1000.0 / n_steps)
    assert finding.evidence["top_kernels"][0]["name"].startswith("ncclDevKernel_Generic")


def test_rocm_trace_gives_the_same_loader_finding_as_cuda(tmp_path: Path) -> None:
    doc = load_doc(ROCM)
    pid, tid = cpu_thread(doc)
    d = _magnitude_us(ROCM)
    starts = step_starts(doc)
    for t in reversed(starts):
        insert_pause(doc, t, d, cause={"name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                                       "cat": "user_annotation", "pid": pid, "tid": tid})
    _check(write_doc(doc, tmp_path), "dataloader_stall", d / 1000.0)


@pytest.mark.parametrize("mfu", [0.05, 0.5])
def test_low_mfu_found_with_its_magnitude(tmp_path: Path, mfu: float) -> None:
    """Matrix multiplications carrying FLOP counts on an H100: MFU 5 % is found with its magnitude,
    MFU 50 % is not.  Its saving (the step at 40 % MFU) is what the trace's other findings leave:
    low MFU is the sum of every inefficiency, theirs included, so it is not counted twice."""
    assert isinstance(low_mfu.analyze(load_trace(SAMPLED, flops=True)), Gap)  # no FLOPs recorded
    trace = load_trace(SAMPLED)
    ctx = context(trace)
    doc = load_doc(SAMPLED)
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    doc["with_flops"] = 1
    mms = [e for e in doc["traceEvents"] if e.get("name") in ("aten::mm", "aten::addmm", "aten::bmm")
           and ctx.start <= e["ts"] < ctx.end]
    per_step = mfu * ctx.step_us / 1e6 * 989.4e12
    for e in mms:
        e["args"]["flops"] = int(per_step * ctx.n_steps / len(mms))
    path = write_doc(doc, tmp_path)
    if 1 - mfu < low_mfu.THRESHOLD.share_of_step:  # the time beyond the FLOPs at peak is 1 - MFU
        assert low_mfu.analyze(load_trace(path, flops=True)) is None
        return
    step_ms = ctx.step_us / 1000.0
    found = _findings(path)
    finding = found["low_mfu"]
    others = sum(f.saving_ms_per_step for kind, f in found.items() if kind != "low_mfu")
    assert others > 0  # the sampled trace's own gpu_idle / exposed_comm
    assert finding.ms_per_step == pytest.approx(step_ms * (1 - mfu), rel=0.10)
    expected = max(0.0, step_ms * (1 - mfu / low_mfu.TARGET_MFU) - min(others, step_ms))
    compute_us, known_us = low_mfu.compute_accounted(load_trace(path, flops=True))
    if known_us < low_mfu.KNOWN_SHARE * compute_us:  # no saving from compute whose FLOPs are unknown
        assert finding.evidence["flops_known_share"] == pytest.approx(known_us / compute_us, abs=1e-3)
        expected = max(0.0, min(expected, ctx.ms(known_us) - step_ms * mfu / low_mfu.TARGET_MFU))
    assert finding.saving_ms_per_step == pytest.approx(expected, rel=0.10, abs=0.01)
    assert finding.evidence["mfu"] == pytest.approx(mfu, rel=0.01)
    assert finding.evidence["device"] == "NVIDIA H100 80GB HBM3"
    assert isinstance(low_mfu.analyze(load_trace(path)), Gap)  # loaded without its FLOP counts


def test_analyzers_never_raise_on_cpu_traces_and_give_gaps() -> None:
    results = rank_findings(load_trace(DATA / "cpu_2rank_gloo_rank0_iter3.json.gz"))
    gaps = {r.kind: r.flag for r in results if not isinstance(r, Finding)}
    assert set(gaps) >= {"gpu_idle", "exposed_comm", "launch_bound", "host_sync", "memcpy", "low_mfu"}
    assert gaps["gpu_idle"] == "--torch-profile-activities cpu cuda"
    assert np.isfinite([r.saving_ms_per_step for r in results if isinstance(r, Finding)]).all()


@pytest.mark.slow
def test_flops_decoded_alike_on_every_path(tmp_path: Path) -> None:
    """FLOP counts come out the same from the plain and the gzipped file, from one process and from
    two, and from the loose decoder (a batch with an unusual value), and not at all unless asked."""
    import gzip

    doc = load_doc(SAMPLED)
    mms = [e for e in doc["traceEvents"] if e.get("name") == "aten::mm"]
    for i, e in enumerate(mms):
        e["args"]["flops"] = 1000 * (i + 1)
    mms[0]["args"]["stream"] = "not a number"  # the loose decoder takes that batch
    plain = write_doc(doc, tmp_path)
    packed = tmp_path / "injected.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expected = sum(1000 * (i + 1) for i in range(len(mms)))
    results = []
    for path, workers in ((plain, 1), (plain, 2), (packed, 1), (packed, 2)):
        trace = load_trace(path, workers=workers, flops=True)
        idx, values = trace.flops
        names = np.array([trace.names[n] for n in trace.name_id[idx]])
        assert values[names == "aten::mm"].sum() == expected, (path.name, workers)  # the carried counts win
        assert set(names) - {"aten::mm"} <= set(FLOP_OPS)  # the rest: matrix products counted from shapes
        results.append((values.sum(), len(idx)))
    assert len(set(results)) == 1, results
    assert load_trace(plain).flops is None


@pytest.mark.slow
def test_dataloader_stall_on_a_cpu_only_trace(tmp_path: Path) -> None:
    """No GPU: the step waits for the whole fetch (a loader with a ``time.sleep``)."""
    source = DATA / "cpu_2rank_gloo_rank0_iter3.json.gz"
    doc = load_doc(source)
    pid, tid = cpu_thread(doc)
    d = 30_000.0
    for t in reversed(step_starts(doc)):
        insert_pause(doc, t, d, cause={"name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                                       "cat": "user_annotation", "pid": pid, "tid": tid})
    assert dataloader_stall.analyze(load_trace(source)) is None
    finding = _check(write_doc(doc, tmp_path), "dataloader_stall", d / 1000.0)
    assert finding.summary.startswith("the step waits")


def test_a_trace_without_steps_is_one_step() -> None:
    results = rank_findings(load_trace(DATA / "gpu_1rank_alexnet.json.gz"))
    found = [r for r in results if isinstance(r, Finding)]
    assert found and all(f.evidence["whole_trace_as_one_step"] for f in found)
    assert all(f.evidence["steps"] == 1 for f in found)


def test_process_group_kinds_from_their_descriptions() -> None:
    kinds = {desc: exposed_comm.group_kind(desc) for desc in (
        "TENSOR_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP", "EXPERT_MODEL_PARALLEL_GROUP",
        "CONTEXT_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_WITH_CP", "default_pg", "mystery", None)}
    assert list(kinds.values()) == ["tp", "pp", "ep", "cp", "dp", "dp", "unknown", "unknown"]


@pytest.mark.slow
def test_exposed_comm_split_by_process_group() -> None:
    """Loaded with its communication fields, the real NCCL trace's exposed all-reduces belong to
    the default (data-parallel) group, and the remedy is Megatron's gradient-reduction overlap."""
    finding = exposed_comm.analyze(load_trace(NCCL, comms=True))
    assert isinstance(finding, Finding)
    assert list(finding.evidence["by_group_ms_per_step"]) == ["dp"]
    assert finding.evidence["by_group_ms_per_step"]["dp"] == pytest.approx(finding.ms_per_step, rel=0.01)
    assert "--overlap-grad-reduce" in finding.remedy
    assert "fsdp2_ms_per_step" not in finding.evidence and "set_modules" not in finding.remedy
    assert "by_group_ms_per_step" not in exposed_comm.analyze(load_trace(NCCL)).evidence


@pytest.mark.slow
def test_exposed_comm_on_an_fsdp2_job_says_fsdp2_s_remedy(tmp_path: Path) -> None:
    """The real NCCL trace with an exposed all-gather inside FSDP2's unshard annotation, twice the
    trace's exposed all-reduces: the remedy is FSDP2's for all-gathers (explicit prefetching,
    ``reshard_after_forward``), not Megatron's."""
    base = exposed_comm.analyze(load_trace(NCCL))
    assert isinstance(base, Finding)
    doc = load_doc(NCCL)
    n_steps = context(load_trace(NCCL)).n_steps
    d = 2 * base.ms_per_step * n_steps * 1000.0
    t = _first_busy_start(NCCL)[0]
    corr = new_correlation(doc)
    pid, tid = cpu_thread(doc)
    insert_pause(doc, t, d, cause=runtime_call("cudaLaunchKernel", pid, tid, corr))
    add_event(doc, {"name": "FSDP::pre_forward (blocks.0)", "cat": "user_annotation", "pid": pid, "tid": tid,
                    "ts": t, "dur": d})
    add_event(doc, device_event("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                                gpu_stream(doc, "nccl"), corr, t, d))
    finding = exposed_comm.analyze(load_trace(write_doc(doc, tmp_path), comms=True))
    assert isinstance(finding, Finding)
    assert list(finding.evidence["fsdp2_ms_per_step"]) == ["all_gather", "reduce_scatter"]
    exposed = finding.evidence["fsdp2_ms_per_step"]
    assert exposed["all_gather"] == pytest.approx(d / 1000.0 / n_steps, rel=0.01)
    assert finding.remedy == exposed_comm.FSDP2_REMEDY["all_gather"]
    assert "Megatron" not in finding.remedy


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(DATA.glob("*.json.gz")), ids=lambda p: p.name)
def test_every_real_trace_gives_json_findings(path: Path) -> None:
    """Every real trace's findings and gaps are plain JSON (the sidecar stores them) and read back."""
    import json

    import msgspec

    results = rank_findings(load_trace(path, flops=True))
    kinds = [k.KIND for k in PER_RANK]
    assert [r.kind for r in results if not isinstance(r, Finding)] == sorted(
        {r.kind for r in results if not isinstance(r, Finding)}, key=kinds.index)  # one gap a kind
    assert {r.kind for r in results} <= set(kinds)
    for result in results:
        doc = json.loads(json.dumps(msgspec.to_builtins(result), allow_nan=False))
        if isinstance(result, Finding):
            assert msgspec.convert(doc, Finding) == result
            assert 0.0 <= result.saving_ms_per_step <= result.ms_per_step + 1e-9


def test_low_mfu_says_how_much_compute_has_no_flops_and_claims_no_saving_from_it() -> None:
    """FLOPs counted from matrix-product and attention shapes cover only part of a real step's GPU
    compute (elementwise, normalisation and optimizer kernels carry none): the finding says how much is
    unaccounted and claims no saving from it."""
    trace = load_trace(DATA / "gpu_1rank_h200_torchprof_faulty.json.gz", flops=True)
    compute_us, known_us = low_mfu.compute_accounted(trace)
    assert 0.3 < known_us / compute_us < low_mfu.KNOWN_SHARE
    finding = low_mfu.analyze(trace, ALL_SIZES)
    assert isinstance(finding, Finding)
    ctx = context(trace)
    assert finding.evidence["flops_known_share"] == pytest.approx(known_us / compute_us, abs=1e-3)
    assert finding.evidence["unaccounted_compute_ms_per_step"] == pytest.approx(ctx.ms(compute_us - known_us),
                                                                                 abs=1e-3)
    assert "unaccounted" in finding.summary and "no saving is claimed" in finding.saving_bound
    ideal_ms = finding.evidence["tflops_per_step"] / finding.evidence["peak_tflops"] * 1e3
    assert finding.saving_ms_per_step <= max(0.0, ctx.ms(known_us) - ideal_ms / low_mfu.TARGET_MFU) + 1e-6
