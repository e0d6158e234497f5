"""The publisher's analyses grow linearly with the trace: no loop over events inside a loop over events.

Each trace shape comes at a base size and at 10x it: the real shapes replicated
(``benchmarks/make_big_trace.py``: the same steps again and again, as a longer window of the same job),
and a generated one dense in collectives (:mod:`helpers.collective_trace`: where a search over all of a
thread's events per collective shows at a small size).  Every analysis the publisher runs into the
sidecar (summary, rank diagnosis, critical path, memory) is timed on both, in this run, on the loaded
trace.  A linear analysis takes ~10x as long on 10x the events; a quadratic one ~100x (the searches
that made a CPU-heavy trace's publication take 76 s).  The bound (25x) leaves room for a busy
machine's noise, never for a quadratic term; the times are the process's CPU time (not the wall
clock: waiting for a core on a loaded host does not count), the best of two runs, and no absolute
time is asserted.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.collective_trace import write_collective_trace
from helpers.paths import DATA, REPO

from torchprof_args.analysis import load_trace, summarize
from torchprof_args.analysis.critical_path.reduced import rank_paths
from torchprof_args.analysis.diagnose.rank import rank_diagnosis
from torchprof_args.analysis.memory.trace_memory import trace_memory_part
from torchprof_args.analysis.trace import Trace

sys.path.insert(0, str(REPO / "benchmarks"))
from make_big_trace import build  # noqa: E402

#: the publisher's analyses of one trace (trace_results.PARTS' computations).
ANALYSES: dict[str, Callable[[Trace], object]] = {
    "summary": summarize, "diagnosis": rank_diagnosis, "critical_path": rank_paths,
    "memory": trace_memory_part,
}
#: the largest growth allowed for 10x the events (linear: 10, quadratic: 100).
MAX_GROWTH = 25.0

pytestmark = pytest.mark.slow


def _best_times(path: Path) -> tuple[int, dict[str, float]]:
    trace = load_trace(path, comms=True, flops=True, memory_rows=True, workers=1)
    times = {}
    for name, analysis in ANALYSES.items():
        best = float("inf")
        for _ in range(2):
            trace.memo.clear()  # nothing derived kept from the last run
            started = time.process_time()  # CPU time: a busy machine's waits for a core do not count
            analysis(trace)
            best = min(best, time.process_time() - started)
        times[name] = best
    return len(trace.ts), times


@pytest.mark.parametrize("source", [
    "cpu_2rank_manual_dp_rank0.json.gz",  # short CPU operators, shapes, stacks, 49 issues a step
    "gpu_2rank_nccl_rank0.json.gz",  # kernels, launches, NCCL
    "generated",  # collectives issued and waited for, little else
])
def test_every_publisher_analysis_grows_linearly(source: str, tmp_path: Path) -> None:
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    if source == "generated":
        write_collective_trace(small, steps=2, per_step=800)  # a bigger model: 10x the events per step
        write_collective_trace(big, steps=2, per_step=8000)
    else:
        one_copy = build(DATA / source, small, 0.001, False) / 1e6  # the source's steps once
        build(DATA / source, big, one_copy * 9.5, False)  # ten times
    n_small, t_small = _best_times(small)
    n_big, t_big = _best_times(big)
    events = n_big / n_small
    assert 8 < events < 12
    growth = {name: t_big[name] / max(t_small[name], 1e-3) for name in ANALYSES}
    print(f"{source}: {events:.1f}x the events; time growth " + ", ".join(
        f"{name} {g:.1f}x ({t_small[name] * 1e3:.0f} -> {t_big[name] * 1e3:.0f} ms)"
        for name, g in growth.items()))
    too_fast = {name: g for name, g in growth.items() if g > MAX_GROWTH * events / 10}
    assert not too_fast, f"grows faster than the events ({events:.1f}x): {too_fast}"
