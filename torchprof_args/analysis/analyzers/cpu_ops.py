"""CPU operators: their nesting per thread, per-name totals and self times, thread busy time.

``torch.profiler`` records CPU operators, annotations and CUDA runtime calls as complete events
that nest on each thread.  :func:`cpu_tree` recovers the nesting without a per-event Python
loop; :func:`cpu_ops` sums, per operator name, what ``torch.profiler``'s table shows (calls, CPU
total, self CPU, device total, self device); :func:`cpu_view` measures how busy each thread was.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchprof_args.analysis.analyzers.intervals import merge_intervals, total
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.trace import Trace

__all__ = ["CPU_OP_CATS", "cpu_ops", "cpu_tree", "cpu_view", "top_ops"]

#: categories of the CPU-side events that form the operator tree.
CPU_OP_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def cpu_tree(trace: Trace) -> dict[str, np.ndarray]:
    """Nesting of CPU events per thread: parent index and depth (vectorised, no per-event loop).

    Events are sorted by (thread, start, longest first, file order); an event's depth is the
    number of earlier events of its thread still open at its start, its parent the closest earlier
    event of its thread one level up.  Threads are done one at a time, so temporaries are only as
    large as the busiest thread; the arrays kept are int32.
    """
    cached = trace._cache.get("cpu_tree")
    if cached is not None:
        return cached
    mask = lookup(trace.cats, CPU_OP_CATS)[trace.cat_id]
    mask &= trace.stream == -1
    idx = np.flatnonzero(mask).astype(np.int32)
    del mask
    thread = trace.thread_id[idx]
    counts = np.bincount(thread) if len(thread) else np.zeros(0, dtype=np.int64)
    if np.count_nonzero(counts) > 1:
        idx = idx[np.argsort(thread, kind="stable")]
    del thread
    n = len(idx)
    parent = np.full(n, -1, dtype=np.int32)
    depth = np.zeros(n, dtype=np.int32)
    lo = 0
    for c in counts[counts > 0]:
        _thread_tree(trace, idx, parent, depth, lo, lo + int(c))
        lo += int(c)
    tree = {"idx": idx, "parent": parent, "depth": depth}
    trace._cache["cpu_tree"] = tree
    return tree


def _start_order(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``np.lexsort((-end, ts))`` (stable), cheaper: sort by start, then fix the rare ties."""
    order = np.argsort(ts, kind="stable")
    s = ts[order]
    tie = s[1:] == s[:-1]
    if tie.any():
        in_group = np.zeros(len(s), dtype=bool)
        in_group[1:] |= tie
        in_group[:-1] |= tie
        pos = np.flatnonzero(in_group)
        sub = order[pos]
        order[pos] = sub[np.lexsort((-end[sub], s[pos]))]
    return order


def _thread_tree(trace: Trace, idx: np.ndarray, parent: np.ndarray, depth: np.ndarray, lo: int, hi: int) -> None:
    """Sort ``idx[lo:hi]`` (one thread, in file order) in place and fill its parent / depth."""
    sel = idx[lo:hi]
    ts = trace.ts[sel]
    end = ts + np.maximum(trace.dur[sel], 0.0)
    order = _start_order(ts, end)
    idx[lo:hi] = sel[order]
    del sel
    ts = ts[order]
    del order
    end.sort(kind="stable")  # ends are nearly in start order: timsort is ~10x faster here
    m = hi - lo
    d = np.searchsorted(end, ts, side="right")
    del ts, end
    np.subtract(np.arange(m, dtype=d.dtype), d, out=d)
    np.maximum(d, 0, out=d)
    d = d.astype(np.int32)
    # The parent of an event at depth k is the closest earlier event at depth k - 1.
    by_depth = np.argsort(d, kind="stable").astype(np.int32)
    counts = np.bincount(d)
    starts = np.r_[0, np.cumsum(counts)]
    p = parent[lo:hi]
    for k in range(len(counts) - 1, 0, -1):
        members = by_depth[starts[k] : starts[k + 1]]
        above = by_depth[starts[k - 1] : starts[k]]
        if len(members) == 0 or len(above) == 0:  # no level above: keep the depth, no parent
            continue
        cand = above[np.maximum(np.searchsorted(above, members) - 1, 0)]
        ok = cand < members
        p[members[ok]] = cand[ok] + lo
        d[members[~ok]] = 0
    depth[lo:hi] = d


#: ops handled per piece in :func:`cpu_ops` (bounds its temporaries).
_PIECE = 1 << 19
_OP_KEYS = ("calls", "cpu_total", "self_cpu", "device_total", "self_device")


def cpu_ops(trace: Trace) -> dict[str, np.ndarray]:
    """Per operator name: calls, CPU total, self CPU, device total, self device (all in us).

    Arrays indexed by name id.  Self CPU is an op's duration minus its children's; device time
    is that of the kernels the op launched (self) or that it and its descendants launched (total).
    """
    tree = cpu_tree(trace)
    out = _cpu_times(trace, tree)
    out["device_total"] = np.zeros(len(trace.names))
    out["self_device"] = np.zeros(len(trace.names))
    _add_device_times(trace, tree, out)
    return {k: out[k] for k in _OP_KEYS}


def _cpu_times(trace: Trace, tree: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Calls, CPU total and self CPU per name.

    Works on millions of ops in pieces: one float array of their size is alive at a time, plus
    piece-sized temporaries.  ``np.add.at`` over consecutive pieces adds in the same order as one
    ``np.bincount`` over everything, so the sums are bit-identical to a one-pass computation.
    """
    idx, parent = tree["idx"], tree["parent"]
    n = len(idx)
    size = len(trace.names)
    out = {"calls": np.zeros(size, dtype=np.int64), "cpu_total": np.zeros(size), "self_cpu": np.zeros(size)}
    pieces = [slice(i, min(i + _PIECE, n)) for i in range(0, n, _PIECE)]
    child = np.zeros(n)
    for sl in pieces:
        names, dur, up = trace.name_id[idx[sl]], trace.dur[idx[sl]], parent[sl]
        np.add.at(out["calls"], names, 1)
        np.add.at(out["cpu_total"], names, dur)
        has = up >= 0
        np.add.at(child, up[has], dur[has])
    for sl in pieces:
        names, dur = trace.name_id[idx[sl]], trace.dur[idx[sl]]
        np.add.at(out["self_cpu"], names, np.maximum(dur - child[sl], 0.0))
    return out


def _add_device_times(trace: Trace, tree: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
    """Add self / total device time per name into ``out``.

    Each kernel counts for the CPU op around the runtime call that launched it (same
    correlation id), then every op's device time is pushed up to its ancestors.
    """
    idx, parent = tree["idx"], tree["parent"]
    n = len(idx)
    kmask = (trace.stream >= 0) & (trace.corr >= 0)
    if n == 0 or not kmask.any():
        return
    rt_corr = trace.corr[idx]
    has_corr = np.flatnonzero(rt_corr >= 0)
    order = has_corr[np.argsort(rt_corr[has_corr], kind="stable")]
    del has_corr
    sorted_corr = rt_corr[order]
    del rt_corr
    kcorr = trace.corr[kmask]
    kdur = trace.dur[kmask]
    del kmask
    total_dev = np.zeros(n)
    if len(sorted_corr):
        pos = np.minimum(np.searchsorted(sorted_corr, kcorr), len(sorted_corr) - 1)
        found = sorted_corr[pos] == kcorr
        launcher = order[pos[found]]
        del pos
        owner = np.where(parent[launcher] >= 0, parent[launcher], launcher)
        np.add.at(total_dev, owner, kdur[found])
        del found, launcher, owner
    del kcorr, kdur, order, sorted_corr
    # Ops without device time add zero to the per-name sums: only visit the others.
    nz = np.flatnonzero(total_dev)
    np.add.at(out["self_device"], trace.name_id[idx[nz]], total_dev[nz])
    del nz
    _push_up(total_dev, parent, tree["depth"])
    nz = np.flatnonzero(total_dev)
    np.add.at(out["device_total"], trace.name_id[idx[nz]], total_dev[nz])


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` for arrays made of a few sorted runs (timsort merges them in linear time)."""
    values = np.sort(values, kind="stable")
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _push_up(amounts: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> None:
    """Add every op's amount into its parent's, deepest level first (in place).

    Only ops with a non-zero amount take part (adding zero changes nothing), so the work and the
    temporaries scale with the ops that launched kernels and their ancestors, not with all ops.
    Within a level, additions happen in index order, as a dense pass would do them.
    """
    active = np.flatnonzero(amounts)
    active_depth = depth[active]
    levels: dict[int, np.ndarray] = {}
    for d in np.unique(active_depth):
        levels[int(d)] = active[active_depth == d]
    del active, active_depth
    top = max(levels, default=0)
    for d in range(top, 0, -1):
        members = levels.pop(d, None)
        if members is None:
            continue
        members = members[(parent[members] >= 0) & (amounts[members] != 0)]
        if len(members) == 0:
            continue
        up = parent[members]
        np.add.at(amounts, up, amounts[members])
        above = levels.get(d - 1)
        levels[d - 1] = _sorted_unique(up if above is None else np.concatenate((above, up)))


def top_ops(trace: Trace, ops: dict[str, np.ndarray], key: str, top: int) -> list[dict[str, Any]]:
    """The ``top`` operator names by ``ops[key]`` (a :func:`cpu_ops` result), as JSON-ready rows."""
    order = np.argsort(-ops[key], kind="stable")
    rows = []
    for i in order[: max(top, 0)]:
        if ops["calls"][i] == 0:
            break
        rows.append(
            {
                "name": trace.names[i],
                "calls": int(ops["calls"][i]),
                "cpu_total_us": float(ops["cpu_total"][i]),
                "self_cpu_us": float(ops["self_cpu"][i]),
                "device_total_us": float(ops["device_total"][i]),
                "self_device_us": float(ops["self_device"][i]),
            }
        )
    return rows


def cpu_view(trace: Trace) -> dict[str, Any] | None:
    """Busy time per CPU thread: union of its top-level operators over the traced span."""
    tree = cpu_tree(trace)
    if len(tree["idx"]) == 0:
        return None
    top = tree["idx"][tree["depth"] == 0]
    ts, thread = trace.ts[top], trace.thread_id[top]
    end = ts + np.maximum(trace.dur[top], 0.0)
    span = float(end.max() - ts.min())
    threads = []
    for t in np.unique(thread):
        sel = thread == t
        busy = total(merge_intervals(ts[sel], end[sel]))
        pid, tid = trace.threads[int(t)]
        threads.append(
            {"pid": pid, "tid": tid, "busy_us": busy, "busy_pct": 100.0 * busy / span if span > 0 else 0.0}
        )
    threads.sort(key=lambda r: -r["busy_us"])
    return {"span_us": span, "threads": threads}
