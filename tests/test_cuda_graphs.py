"""CUDA graphs: kernels replayed by ``cudaGraphLaunch`` count for the region around the call, and
``launch_bound`` knows when graphs already run.

No GPU here, and no trace in tests/data was recorded with CUDA graphs, so the graph trace is derived
in the test from a real GPU trace, the way Kineto writes a replay: a run of the step's kernel
launches becomes one ``cudaGraphLaunch`` call (inside a ``record_function`` region), and every
kernel it launched carries that call's correlation id (CUPTI gives a graph's kernels the launch's
correlation id; HTA's issue #290).  The kernels themselves, their streams and times, are the
recorded ones.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.paths import DATA

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.analyzers.cpu_ops import cpu_ops
from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.analysis.diagnose.context import KindContext
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.diagnose.kinds import launch_bound

SOURCE = DATA / "gpu_2rank_nccl_rank0.json.gz"
#: launches folded into the one graph replay.
CAPTURED = 60
REGION = "cuda_graph_replay"


def _graph_trace(path: Path) -> tuple[Path, list[float]]:
    """``SOURCE`` with its first step's first ``CAPTURED`` kernel launches replayed by one graph;
    the replayed kernels' durations."""
    with gzip.open(SOURCE) as f:
        doc = json.loads(f.read())
    events: list[dict[str, Any]] = doc["traceEvents"]
    first_step = min((e for e in events if e.get("name", "").startswith("ProfilerStep#")),
                     key=lambda e: e["ts"])
    end = first_step["ts"] + first_step["dur"]
    launches = sorted((e for e in events if e.get("name") == "cudaLaunchKernel"
                       and first_step["ts"] <= e["ts"] < end), key=lambda e: e["ts"])[:CAPTURED]
    graph = launches[0]["args"]["correlation"]
    folded = {e["args"]["correlation"] for e in launches}
    replayed = []
    for e in events:
        if e.get("cat") == "kernel" and e["args"].get("correlation") in folded:
            e["args"]["correlation"] = graph
            replayed.append(float(e["dur"]))
    gone = {id(e) for e in launches[1:]}
    events[:] = [e for e in events if id(e) not in gone
                 and not (e.get("cat") == "ac2g" and e.get("id") in folded - {graph})]
    call = launches[0]
    call["name"] = "cudaGraphLaunch"
    events.append({"ph": "X", "cat": "user_annotation", "name": REGION, "pid": call["pid"],
                   "tid": call["tid"], "ts": call["ts"] - 0.5, "dur": call["dur"] + 1.0, "args": {}})
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    assert len(replayed) == CAPTURED
    return path, replayed


@pytest.fixture(scope="module")
def graph_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    return _graph_trace(tmp_path_factory.mktemp("graphs") / "rank0.pt.trace.json.gz")


def test_replayed_kernels_count_for_the_region_around_the_graph_launch(
        graph_trace: tuple[Path, list[float]]) -> None:
    path, replayed = graph_trace
    trace = load_trace(path)
    ops = cpu_ops(trace)
    region = trace.names.index(REGION)
    assert ops["device_total"][region] == pytest.approx(sum(replayed), rel=1e-9)
    # the innermost operator around the launch call: every replayed kernel is its own
    assert ops["self_device"][region] == pytest.approx(sum(replayed), rel=1e-9)


def test_launch_bound_says_graphs_already_replay_part_of_the_step(
        graph_trace: tuple[Path, list[float]]) -> None:
    path, replayed = graph_trace
    trace = load_trace(path)
    ctx = context(trace)
    graphs = launch_bound.graph_replays(trace, ctx)
    assert graphs is not None
    in_steps = int(np.isin(trace.dur[ctx.kernels], replayed).sum())
    assert graphs["kernels_replayed"] == CAPTURED and in_steps >= CAPTURED
    assert graphs["graph_launches_per_step"] == round(1 / ctx.n_steps, 2)
    busy = ctx.k_end - ctx.k_ts
    assert graphs["replayed_gpu_share"] == pytest.approx(sum(replayed) / busy.sum(), abs=1e-3)
    finding = launch_bound.analyze(trace, KindContext(thresholds_off=True))
    assert isinstance(finding, Finding)
    assert finding.remedy == launch_bound.GRAPHS_REMEDY and finding.evidence["cuda_graphs"] == graphs
    assert "CUDA graphs already replay" in finding.summary

    plain = launch_bound.analyze(load_trace(SOURCE), KindContext(thresholds_off=True))
    assert isinstance(plain, Finding)
    assert plain.remedy == launch_bound.REMEDY and "cuda_graphs" not in plain.evidence
    # the replayed kernels never wait for a launch of their own: less host-wait, never more
    assert finding.ms_per_step <= plain.ms_per_step
