"""The pieces of the memory breakdown on inputs whose answer is known: the ``[memory]`` rows a trace
decodes to (one process or two), the innermost enclosing event, the replay of allocations (peak,
steps, tensors kept across steps), the outlier ranks, the real CPU trace of tests/data."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from helpers.nvml import memory_stats
from helpers.paths import DATA

from torchprof_args.analysis.analyzers.nesting import Nesting
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.memory.allocator import allocator_view
from torchprof_args.analysis.memory.breakdown import Allocations, Where, breakdown
from torchprof_args.analysis.memory.categories import (
    ACTIVATION,
    OTHER,
    PARAMETER,
    TEMPORARY,
    ByCategory,
    MemoryPart,
)
from torchprof_args.analysis.memory.ranks import outliers, rank_rows
from torchprof_args.analysis.memory.trace_memory import trace_memory_part
from torchprof_args.capture.metrics.config import MetricsConfig
from torchprof_args.capture.metrics.hardware import DeviceReadings
from torchprof_args.capture.metrics.writer import MetricsWriter
from torchprof_args.capture.runtime.metadata import megatron_coordinates
from torchprof_args.console import main
from torchprof_args.shared import formats

GIB = 1 << 30

TRACE = DATA / "cpu_2rank_gloo_rank0_iter3.json.gz"


def test_memory_rows_are_the_same_decoded_by_one_or_two_processes(tmp_path: Path) -> None:
    plain = tmp_path / "t.json"
    with gzip.open(TRACE, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    events = [e for e in json.loads(plain.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    one = load_trace(plain, workers=1, memory_rows=True).memory_rows
    two = load_trace(plain, workers=2, memory_rows=True).memory_rows
    assert one is not None and two is not None and len(one) == len(two) == len(events)
    for name, column in one.columns.items():
        assert np.array_equal(column, two.columns[name]), name
    assert one.columns["bytes"].tolist() == [e["args"]["Bytes"] for e in events]
    assert load_trace(plain).memory_rows is None  # kept only when asked


def test_nesting_finds_the_innermost_enclosing_event() -> None:
    starts = np.array([0.0, 1.0, 2.0, 6.0, 10.0])
    ends = np.array([9.0, 5.0, 3.0, 8.0, 11.0])  # 0 ( 1 ( 2 ) ) ( 3 ) ; 4 apart
    found = Nesting(starts, ends).innermost(np.array([0.5, 2.5, 4.0, 5.5, 7.0, 9.5, 10.5, 12.0]))
    assert found.tolist() == [0, 2, 1, 0, 3, -1, 4, -1]
    assert Nesting(starts, ends).chain(2) == [2, 1, 0]


def test_the_replay_finds_the_peak_the_steps_and_a_tensor_kept_across_steps() -> None:
    places = [
        Where("other", site="(allocated before the window)"),
        Where("forward", "aten::mm", "Linear_0", "a.py: f"),
        Where("forward", "aten::ones", None, "a.py: g > ones"),
    ]
    inf = np.inf
    rows = [  # start, end, size, category, place
        (-inf, inf, 100, PARAMETER, 0),
        (1.0, 4.0, 50, ACTIVATION, 1),
        (2.0, 3.0, 30, TEMPORARY, 1),
        (4.5, inf, 10, OTHER, 2),  # step 1
        (11.0, 14.0, 50, ACTIVATION, 1),
        (14.5, inf, 10, OTHER, 2),  # step 2
        (21.0, 24.0, 50, ACTIVATION, 1),
        (24.5, inf, 10, OTHER, 2),  # step 3
    ]
    table = np.array(rows, dtype=np.float64)
    allocs = Allocations(
        "cpu",
        table[:, 0],
        table[:, 1],
        table[:, 2].astype(np.int64),
        table[:, 3].astype(np.int8),
        table[:, 4].astype(np.int32),
        places,
        (0.0, 30.0),
        [("ProfilerStep#1", 0.0, 10.0), ("ProfilerStep#2", 10.0, 20.0), ("ProfilerStep#3", 20.0, 30.0)],
    )
    found = breakdown(allocs)
    assert found is not None
    assert found.peak_bytes == 180 and found.peak.step == "ProfilerStep#1" and found.peak.op == "aten::mm"
    assert found.by_category == ByCategory(parameter=100, activation=50, temporary=30)
    assert [s.peak_bytes for s in found.steps] == [180, 160, 170] and found.end_bytes == 130
    (kept,) = found.retained
    assert (kept.site, kept.bytes, kept.per_step_bytes, kept.steps) == ("a.py: g > ones", 20, 10, 3)
    assert found.top_sites[0].site == "(allocated before the window)"


def test_the_outlier_rank_is_named_with_its_stage() -> None:
    def part(rank: int, stage: int, activation: int) -> tuple[str, MemoryPart]:
        allocs = Allocations(
            "cuda:0",
            np.array([-np.inf, 1.0]),
            np.array([np.inf, 2.0]),
            np.array([1 << 30, activation], dtype=np.int64),
            np.array([PARAMETER, ACTIVATION], np.int8),
            np.array([0, 0], np.int32),
            [Where("forward")],
            (0.0, 3.0),
        )
        device = breakdown(allocs)
        assert device is not None
        return f"rank{rank}", MemoryPart(1, "trace", [], rank, 4, stage, None, [device])

    parts = [part(0, 0, 8 << 30), part(1, 1, 2 << 30), part(2, 2, 2 << 30), part(3, 3, 2 << 30)]
    (found,) = outliers(rank_rows(parts))
    assert found.rank == 0 and found.stage == 0 and found.category == "activation"
    assert found.over_median_bytes == 6 << 30 and "pipeline stage 0" in found.summary


def test_a_real_cpu_trace_from_the_demo_is_categorised() -> None:
    """tests/data's demo trace (a 2-rank GPT with AdamW, profile_memory, stacks, no shapes): the trace's
    categories, gradients measured, parameters inferred from them, the peak in a step."""
    part = trace_memory_part(load_trace(TRACE, memory_rows=True))
    (cpu,) = part.devices
    assert part.source == "trace" and part.rank == 0 and cpu.device == "cpu"
    assert cpu.category_peaks.gradient > 0 and cpu.category_peaks.parameter == cpu.category_peaks.gradient
    assert cpu.peak.step == "ProfilerStep#3" and cpu.peak.phase == "backward"  # activations dominate
    assert cpu.steps[0].activations_for_backward_bytes == cpu.category_peaks.activation
    assert cpu.timeline.t_ms and len(cpu.timeline.t_ms) <= 240
    assert any("inferred" in note for note in part.notes)


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json.gz")), ids=lambda p: p.name)
def test_every_real_trace_is_categorised_without_an_error(path: Path) -> None:
    """A gloo worker thread with memory events and no operator (or no backward operator) once
    crashed the trace's categorisation (IndexError), and with it the publisher's memory part."""
    part = trace_memory_part(load_trace(path, memory_rows=True))
    assert part.format == formats.MEMORY.version and part.source in ("trace", "none")


def test_allocator_peaks_of_every_rank_from_metrics_jsonl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The metrics writer's per-rank allocator readings (a stand-in torch.cuda.memory_stats: no GPU
    here) read back by `torchprof mem` on the run folder; then 4 ranks, rank 2 over the median."""
    config = MetricsConfig(str(tmp_path), sinks=("jsonl",))
    writer = MetricsWriter(config, rank=0, world_size=1, console=False)
    stats = {
        "allocated_bytes.all.peak": 30 * GIB,
        "reserved_bytes.all.peak": 34 * GIB,
        "num_alloc_retries": 2,
    }
    writer.readings = DeviceReadings(memory_stats=memory_stats(stats), hardware=False)
    writer.log_step(10, iteration_time=0.5)
    writer.close()
    view = allocator_view(tmp_path / "metrics.jsonl")
    assert view is not None and view.iteration == 10 and view.outliers == []
    (rank,) = view.ranks
    assert (rank.max_allocated_bytes, rank.max_reserved_bytes, rank.alloc_retries) == (30 * GIB, 34 * GIB, 2)
    per_rank = {"memory/max-allocated-gb": [30.0, 30.5, 41.0, 30.2], "memory/max-reserved-gb": [34.0] * 4}
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"iteration": 20, "metrics": {}, "per_rank": per_rank}) + "\n"
    )
    view = allocator_view(tmp_path / "metrics.jsonl")
    assert view is not None and view.outliers == [2] and "rank(s) 2" in view.summary
    assert main(["mem", str(tmp_path)]) == 0  # no trace, no snapshot: the allocator's view alone
    assert "metrics.jsonl: allocator peaks of 4 ranks at iteration 20" in capsys.readouterr().out


def test_megatron_coordinates_come_from_its_parallel_state_never_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stand-in for megatron-core's parallel state (initialising the real one needs a job): the
    coordinates when it is up, None when it is not or when megatron was never imported."""
    monkeypatch.delitem(sys.modules, "megatron.core.parallel_state", raising=False)
    assert megatron_coordinates() is None
    state = types.SimpleNamespace(
        model_parallel_is_initialized=lambda: True,
        get_data_parallel_rank=lambda: 3,
        get_tensor_model_parallel_rank=lambda: 1,
        get_pipeline_model_parallel_rank=lambda: 0,
        get_context_parallel_rank=lambda: 0,
        get_expert_model_parallel_rank=lambda: 0,
    )
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", state)
    assert megatron_coordinates() == {"dp": 3, "tp": 1, "pp": 0, "cp": 0, "ep": 0}
    state.model_parallel_is_initialized = lambda: False
    assert megatron_coordinates() is None
