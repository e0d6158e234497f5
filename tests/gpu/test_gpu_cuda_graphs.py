"""CUDA graphs on a real GPU: the kernels a ``cudaGraphLaunch`` replays carry its correlation id in
Kineto's trace, count for the region around the replay, and ``launch_bound`` reports the graphs
(the CPU test, tests/test_cuda_graphs.py, derives such a trace; this one records it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.cuda import requires_gpus

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.analyzers.cpu_ops import cpu_ops
from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.analysis.diagnose.kinds import launch_bound

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1)]

REGION = "graph_replay"


@pytest.mark.timeout(180)
def test_replayed_kernels_are_attributed_and_reported(tmp_path: Path) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]).cuda()
    static = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # warm up on a side stream before capture, as PyTorch's docs say
            model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        model(static)
    path = tmp_path / "graphs.pt.trace.json"
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, schedule=torch.profiler.schedule(wait=0, warmup=1,
                                                                                        active=3)) as prof:
        for _ in range(4):
            with torch.profiler.record_function(REGION):
                graph.replay()
            torch.cuda.synchronize()
            prof.step()
    prof.export_chrome_trace(str(path))

    trace = load_trace(path)
    graphs = launch_bound.graph_replays(trace, context(trace))
    assert graphs is not None, "no kernel carries a cudaGraphLaunch's correlation id"
    assert graphs["kernels_replayed"] >= 8 * 3 and graphs["replayed_gpu_share"] > 0.9, graphs
    assert graphs["graph_launches_per_step"] == pytest.approx(1.0)
    ops = cpu_ops(trace)
    assert ops["device_total"][trace.names.index(REGION)] > 0
