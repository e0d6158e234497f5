"""DeepSpeed integration on real engines: 2 gloo ranks on CPU, ZeRO stage 1, gradient
accumulation 2, wall_clock_breakdown and the flops profiler on; then a resume from the
DeepSpeed checkpoint; and a pipeline-parallel PipelineEngine (2 stages, gradient accumulation 3)
whose optimizer steps happen inside train_batch().  Runs the README's examples verbatim."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from helpers.examples import run_doc_example

from torchprof_args.shared.metrics_log import read_records


def _profiler_steps(path: Path) -> list[int]:
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events
                   if e.get("name", "").startswith("ProfilerStep#")})


@pytest.mark.slow
def test_readme_example_optimizer_steps_timers_flops_report_and_resume(tmp_path):
    proc = run_doc_example("deepspeed", tmp_path, WANDB_MODE="disabled")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    prof = tmp_path / "prof"
    traces = sorted(prof.glob("*/*.pt.trace.json.gz"))
    windows = sorted(p.name.split("_")[0] + "_" + p.parent.name[len("iter"):] for p in traces)
    # skip-first 2, warmup 1, active 2 -> optimizer steps 4-5 on both ranks; after the resume at
    # step 6, --torch-profile-step-start 8 -> global step 8 on rank 0.
    assert windows == ["rank00000_000004-000005", "rank00000_000008-000008",
                       "rank00001_000004-000005"], windows
    for trace in traces:
        expected = [8] if trace.parent.name == "iter000008-000008" else [4, 5]
        # ProfilerStep#N are optimizer steps (2 micro-steps each), not micro-steps.
        assert _profiler_steps(trace)[: len(expected)] == expected
        with gzip.open(trace, "rt") as handle:
            events = json.load(handle)["traceEvents"]
        backward_passes = [e for e in events if e.get("name") == "autograd::engine::evaluate_function: "
                           "torch::autograd::AccumulateGrad"]
        assert backward_passes, "the recorded window contains the backward passes"

    report = (prof / "profiler_ds.txt").read_text()
    assert "DeepSpeed Flops Profiler" in report and "fwd flops per GPU" in report
    published = [line for line in proc.stderr.splitlines() if "DeepSpeed flops profile written" in line]
    assert len(published) == 1 and "rank 0]" in published[0], published  # DeepSpeed writes it on rank 0 only
    assert not list(prof.rglob(".partial-*"))

    records = read_records(prof / "metrics.jsonl")  # each run's run / run_end lines are not intervals
    assert [r.iteration for r in records][:3] == [2, 4, 6]
    for name in ("fwd", "bwd", "bwd_allreduce", "step"):
        assert records[0].metrics[f"deepspeed/{name}-ms"] > 0
        assert len(records[0].per_rank[f"deepspeed/{name}-ms"]) == 2

    # model FLOPs per optimizer step from DeepSpeed's flops profiler (profile_step 2: the step after
    # 2 finished ones, rank 0): its forward FLOPs per GPU x3 (forward + backward) x 2 micro-batches x
    # 2 ranks, written from the next log interval on; TFLOP/s per GPU from them
    value, unit = re.search(r"fwd flops per GPU:\s+([0-9.]+) ?([KMGT]?)", report).groups()
    forward = float(value) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[unit]
    assert "Profile Summary at step 3" in report
    assert "throughput" not in records[0].metrics  # step 2: not measured yet
    for record in records[1:3]:  # the first run: steps 4, 6
        metrics = record.metrics
        assert metrics["throughput/model-flops-per-iteration"] == pytest.approx(3 * forward * 2 * 2, rel=1e-2)
        assert record.per_rank["throughput/model-flops-per-iteration"][1] is None  # measured on rank 0
        assert metrics["throughput"] == pytest.approx(
            metrics["throughput/model-flops-per-iteration"] / metrics["iteration-time"] / 2 / 1e12)


def _events_per_step(events: list[dict], name: str) -> dict[int, int]:
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    counts = {int(s["name"].split("#")[1]): 0 for s in steps}
    for event in events:
        if event.get("name") == name and event.get("ph") == "X":
            for step in steps:
                if step["ts"] <= event["ts"] <= step["ts"] + step["dur"]:
                    counts[int(step["name"].split("#")[1])] += 1
    return counts


@pytest.mark.slow
def test_readme_example_pipeline_engine_steps_on_optimizer_steps_of_both_stages(tmp_path):
    """A real PipelineModule in 2 stages on 2 gloo ranks, gradient accumulation 3: train_batch()
    takes the optimizer steps (not engine.step()), and both stages' traces number them."""
    proc = run_doc_example("deepspeed-pipeline", tmp_path, WANDB_MODE="disabled")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "stage 1: done at global step 5 (3 micro-batches each)" in proc.stdout
    traces = sorted((tmp_path / "prof").glob("*/*.pt.trace.json.gz"))
    assert [p.name.split("_")[0] + "_" + p.parent.name[len("iter"):] for p in traces] == [
        "rank00000_000003-000004", "rank00001_000003-000004"]
    micro_batch_forward = {0: "aten::embedding", 1: "aten::cross_entropy_loss"}  # first and last stage
    for stage, trace in enumerate(traces):
        with gzip.open(trace, "rt") as handle:
            events = json.load(handle)["traceEvents"]
        assert _profiler_steps(trace) == [3, 4]
        assert _events_per_step(events, micro_batch_forward[stage]) == {3: 3, 4: 3}, stage
        assert _events_per_step(events, "Optimizer.step#AdamW.step") == {3: 1, 4: 1}, stage
        _check_execution_trace(trace, events, micro_batch_forward[stage])
    assert not list((tmp_path / "prof").rglob(".partial-*"))


def _check_execution_trace(trace: Path, kineto_events: list[dict], micro_batch_forward: str) -> None:
    """--torch-profile-execution-trace: a valid Chakra execution trace of the same window,
    published beside."""
    et_path = trace.parent / "execution_traces" / trace.name.replace(".pt.trace.json.gz", ".et.json.gz")
    with gzip.open(et_path, "rt") as handle:
        execution_trace = json.load(handle)
    assert execution_trace["schema"].startswith("1.") and "chakra" in execution_trace["schema"]
    nodes = execution_trace["nodes"]
    ids = {node["id"] for node in nodes}
    assert len(ids) == len(nodes) and all({"name", "ctrl_deps", "inputs", "outputs"} <= node.keys()
                                          for node in nodes)
    assert all(node["ctrl_deps"] in ids for node in nodes if node["ctrl_deps"]), (
        "parents are nodes of the trace")
    names = [node["name"] for node in nodes]
    # The same window as the Kineto trace: steps 3 and 4, their micro-batches, their operators.
    assert sorted(name for name in names if name.startswith("ProfilerStep#")) == [
        "ProfilerStep#3", "ProfilerStep#4"]
    assert names.count(micro_batch_forward) == 6 and names.count("Optimizer.step#AdamW.step") == 2
    kineto_ops = sum(1 for e in kineto_events if e.get("cat") == "cpu_op" and e["name"].startswith("aten::"))
    et_ops = sum(1 for name in names if name.startswith("aten::"))
    assert kineto_ops > 1000 and 0.9 <= et_ops / kineto_ops <= 1.1, (et_ops, kineto_ops)
