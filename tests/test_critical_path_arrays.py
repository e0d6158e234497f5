"""The array machinery under the critical path's graph: many short ranges expanded at once
(:mod:`~torchprof_args.analysis.critical_path.ranges`), the stable order of integer keys
(:mod:`~torchprof_args.analysis.critical_path.sorting`), and the contracted graph's two ways of
finding its runs (the builder's edge order, checked; pointer jumping for any other order) giving
the same replay."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers.paths import DATA

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.critical_path.contract import contract
from torchprof_args.analysis.critical_path.edges import INDEX
from torchprof_args.analysis.critical_path.graph import local_graph
from torchprof_args.analysis.critical_path.ranges import first_of_each, last_of_each, range_pairs
from torchprof_args.analysis.critical_path.reduced import tables
from torchprof_args.analysis.critical_path.sorting import stable_order


@pytest.mark.parametrize("low, high, n", [(0, 5, 100_000), (-3, 40_000, 100_000), (-10**9, 10**9, 100_000),
                                          (-2**62, 2**62, 1000), (0, 1, 0), (7, 8, 1)])
def test_stable_order_is_numpy_s_stable_argsort(low: int, high: int, n: int) -> None:
    """Each of its three ways (16-bit radix, packed pairs, numpy's own past what packs) and the
    trivial sizes: the same order as ``np.argsort(kind="stable")``, ties in position order."""
    keys = np.random.default_rng(n).integers(low, high, n)
    for dtype in (np.int64, np.int32) if high < 2**31 and low >= -2**31 else (np.int64,):
        got = stable_order(keys.astype(dtype))
        assert got.dtype == np.int64 and np.array_equal(got, np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("pairs", [1, 3, 1 << 20])
def test_range_pairs_expands_every_range_in_order_in_chunks(pairs: int) -> None:
    lo = np.array([0, 5, 7, 7, 2])
    hi = np.array([3, 5, 9, 6, 4])  # empty: 5..5 and 7..6
    got = [(int(q), int(i)) for qs, ixs in range_pairs(lo, hi, pairs) for q, i in zip(qs, ixs, strict=True)]
    assert got == [(0, 0), (0, 1), (0, 2), (2, 7), (2, 8), (4, 2), (4, 3)]
    query = np.array([0, 0, 2, 4, 4])
    assert first_of_each(query).tolist() == [True, False, True, True, False]
    assert last_of_each(query).tolist() == [False, True, True, False, True]


def test_contracting_edges_in_any_order_replays_the_same() -> None:
    graph = local_graph(load_trace(DATA / "cpu_2rank_gloo_rank0_iter3.json.gz", comms=True))
    direct = contract(graph)
    assert direct.members is None  # the builder's order: every run a range of edge indices
    shuffled = np.random.default_rng(0).permutation(len(graph.src))
    back = np.argsort(shuffled)
    other = replace(graph, src=graph.src[shuffled], dst=graph.dst[shuffled], weight=graph.weight[shuffled],
                    nominal=graph.nominal[shuffled], kind=graph.kind[shuffled],
                    category=graph.category[shuffled], owner=graph.owner[shuffled],
                    flag=graph.flag[shuffled], binding=np.where(graph.binding >= 0, back[graph.binding], -1)
                    .astype(INDEX))
    jumped = contract(other)
    assert jumped.members is not None
    assert tables(graph, None, direct) == tables(other, None, jumped)
