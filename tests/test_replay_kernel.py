"""The critical path's replay kernel: the C extension's and numba's give what the plain Python kernel
(the reference, ``replay_kernel.kernel``) gives, on real traces' graphs (plain and what-if replays)
and on generated graphs; the C kernel refuses arrays it cannot follow instead of reading or writing
out of bounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers.paths import DATA

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.critical_path import propagate, replay_kernel
from torchprof_args.analysis.critical_path.edges import WAIT
from torchprof_args.analysis.critical_path.graph import local_graph
from torchprof_args.analysis.critical_path.propagate import Replay, replay

FIELDS = ("label1", "time1", "work1", "label2", "time2", "work2", "via")
TRACES = ["gpu_2rank_nccl_rank0.json.gz", "gpu_128rank_sampled_rank0.json.gz",
          "cpu_2rank_manual_dp_rank0.json.gz", "cpu_2rank_ddp_rank0.json.gz"]


def _c_kernel() -> Callable[..., Any]:
    kernel = replay_kernel._c_kernel()
    if kernel is None:
        pytest.skip("the C replay kernel is not built (no compiler at install: `make setup` builds it)")
    return kernel


def _numba_kernel() -> Callable[..., Any]:
    pytest.importorskip("numba", reason="numba (the analysis extra) compiles the replay")
    kernel = replay_kernel._numba_kernel()
    assert kernel is not None
    return kernel


VARIANTS = {"c": _c_kernel, "numba": _numba_kernel}


def _replays(graph: Any, monkeypatch: pytest.MonkeyPatch, fast: Callable[..., Any] | None,
             **what_if: np.ndarray) -> Replay:
    monkeypatch.setattr(propagate, "compiled", lambda edges: fast)
    return replay(graph, **what_if)


def _same(a: Replay, b: Replay) -> None:
    for name in FIELDS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.sinks == b.sinks


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", TRACES)
def test_the_compiled_replay_equals_the_plain_one(name: str, variant: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fast = VARIANTS[variant]()
    graph = local_graph(load_trace(DATA / name, comms=True))
    assert len(graph.src) > 100
    _same(_replays(graph, monkeypatch, fast), _replays(graph, monkeypatch, None))
    # a what-if: the waits cut, every other edge's weight halved
    cut = graph.kind == WAIT
    weight = graph.weight / 2
    _same(_replays(graph, monkeypatch, fast, cut=cut, weight=weight),
          _replays(graph, monkeypatch, None, cut=cut, weight=weight))


def _random_graph(rng: np.random.Generator, n: int, steps: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A random DAG in the kernel's arrays (nodes in topological order 0..n-1, edges from lower to
    higher nodes, some sources, fixed labels, early nodes and step ends), and its zeroed outputs."""
    dst = rng.integers(1, n, size=4 * n)
    src = (rng.random(4 * n) * dst).astype(np.int64)
    by_dst = np.argsort(dst, kind="stable")
    ptr = np.r_[0, np.cumsum(np.bincount(dst, minlength=n))].astype(np.int64)
    t = np.sort(rng.random(n) * 1000)
    start_label = np.where(rng.random(n) < 0.02, rng.integers(0, 5, n), replay_kernel.NONE).astype(np.int64)
    restart = np.full(n, -1, np.int64)
    restart[np.sort(rng.choice(np.arange(1, n), steps, replace=False))] = np.arange(steps)
    weights = np.round(rng.random(4 * n) * 10, 1)  # ties between paths are common, as in real graphs
    inputs = [np.arange(n, dtype=np.int64), ptr, by_dst.astype(np.int64), src, weights, weights * 0.5,
              start_label, t < 5, restart, t]
    outputs = [np.full(k, replay_kernel.NONE, np.int64) if i in (0, 3) else np.full(k, -1, np.int64) if i == 6
               else np.full(k, -np.inf) if i in (1, 4) else np.zeros(k)
               for k in (n, steps) for i in range(7)]
    return inputs, outputs


@pytest.mark.parametrize("seed", range(5))
def test_the_c_kernel_equals_the_plain_one_on_generated_graphs(seed: int) -> None:
    fast = _c_kernel()
    inputs, outputs = _random_graph(np.random.default_rng(seed), 3000, 7)
    fast(*inputs, *outputs)
    lists = [x.tolist() for x in _random_graph(np.random.default_rng(seed), 3000, 7)[1]]
    replay_kernel.kernel(*(x.tolist() for x in inputs), *lists)
    for got, want in zip(outputs, lists, strict=True):
        assert np.array_equal(got, np.asarray(want, dtype=got.dtype))


def test_the_c_kernel_refuses_what_it_cannot_follow() -> None:
    fast = _c_kernel()
    inputs, outputs = _random_graph(np.random.default_rng(0), 100, 2)
    bad_source = [*inputs[:3], np.r_[inputs[3][:-1], 100], *inputs[4:]]  # an edge from node 100 of 100
    with pytest.raises(ValueError, match="out of range"):
        fast(*bad_source, *outputs)
    short = [*inputs[:4], inputs[4][:-1], *inputs[5:]]
    with pytest.raises(ValueError, match="lengths"):
        fast(*short, *outputs)
    narrow = [inputs[0].astype(np.int32), *inputs[1:]]
    with pytest.raises(TypeError, match="order must be a contiguous int64 array"):
        fast(*narrow, *outputs)
    with pytest.raises(ValueError):  # an output that cannot be written
        read_only = outputs[0].copy()
        read_only.flags.writeable = False
        fast(*inputs, read_only, *outputs[1:])
