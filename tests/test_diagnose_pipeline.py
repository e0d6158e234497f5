"""``pipeline_bubble`` on a real GPU trace with a bubble injected, the schedule in the trace metadata,
and the schedule Megatron-LM's arguments give."""

from __future__ import annotations

import argparse
import copy

import pytest
from helpers.inject import insert_pause, load_doc, step_starts, write_doc
from helpers.paths import DATA

from torchprof_args.analysis.analyzers.gpu import COMPUTATION, kernel_type
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.diagnose.kinds.pipeline_bubble import analyze, theoretical_bubble
from torchprof_args.capture.frameworks.megatron_loop import pipeline_from_args
from torchprof_args.capture.runtime.metadata import pipeline_metadata

SOURCE = DATA / "gpu_2rank_nccl_rank0.json.gz"


def _quiet_point(kernels: list[dict], lo: float, hi: float) -> float:
    """A time in the middle of [lo, hi) right after a computation kernel, when no kernel runs."""
    busy = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
    inside = sorted((k for k in kernels if lo <= k["ts"] < hi and kernel_type(k["name"]) == COMPUTATION),
                    key=lambda k: k["ts"])
    for k in inside[len(inside) // 2:]:
        t = k["ts"] + k["dur"] + 0.5
        if not any(s <= t < e for s, e in busy):
            return t
    raise AssertionError("no quiet point in the step")


def _bubble_ms(path) -> float | None:
    found = analyze(load_trace(path))
    assert not isinstance(found, Gap)
    return None if found is None else found.ms_per_step


@pytest.mark.slow
def test_injected_bubble_is_measured_within_10_percent(tmp_path):
    doc = load_doc(SOURCE)
    assert _bubble_ms(write_doc(doc, tmp_path, "plain.json")) is None  # no schedule: not a pipeline stage
    doc["torchprof_args"] = {"pipeline": pipeline_metadata(4, 8, stage=1)}
    clean = _bubble_ms(write_doc(doc, tmp_path, "clean.json"))
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    starts = step_starts(doc)
    ends = [*starts[1:], max(k["ts"] + k["dur"] for k in kernels)]
    points = [_quiet_point(kernels, lo, hi) for lo, hi in zip(starts, ends, strict=True)]
    injected = copy.deepcopy(doc)
    for t in sorted(points, reverse=True):
        insert_pause(injected, t, 20e3)
    found = analyze(load_trace(write_doc(injected, tmp_path, "bubble.json")))
    assert isinstance(found, Finding) and found.ranks == (0,)
    assert found.ms_per_step - (clean or 0.0) == pytest.approx(20.0, rel=0.10)
    assert (found.evidence["stages"], found.evidence["micro_batches"], found.evidence["stage"]) == (4, 8, 1)
    assert found.evidence["theoretical_bubble_share"] == pytest.approx(3 / 11, abs=1e-4)


def test_theoretical_bubble():
    assert theoretical_bubble(2, 3) == pytest.approx(0.25)
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11)


def test_megatron_arguments_give_the_schedule():
    args = argparse.Namespace(pipeline_model_parallel_size=4, global_batch_size=64, micro_batch_size=2,
                              data_parallel_size=4)
    assert pipeline_from_args(args) == {"stages": 4, "micro_batches": 8}
    assert pipeline_from_args(argparse.Namespace(pipeline_model_parallel_size=1, global_batch_size=64,
                                                 micro_batch_size=2, data_parallel_size=4)) is None
    assert pipeline_from_args(argparse.Namespace()) is None
