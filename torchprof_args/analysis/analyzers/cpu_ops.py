"""CPU operators: their nesting per thread, per-name totals and self times, thread busy time.

``torch.profiler`` records CPU operators, annotations and CUDA runtime calls as complete events
that nest on each thread.  :func:`cpu_tree` recovers the nesting without a per-event Python
loop; :func:`cpu_ops` sums, per operator name, what ``torch.profiler``'s table shows (calls, CPU
total, self CPU, device total, self device); :func:`cpu_view` measures how busy each thread was.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.intervals import merge_intervals, total
from torchprof_args.analysis.trace import Trace

__all__ = [
    "CPU_OP_CATS", "CpuThreads", "OperatorTotal", "ThreadBusy", "cpu_ops", "cpu_tree", "cpu_view", "top_ops",
]

#: categories of the CPU-side events that form the operator tree.
CPU_OP_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


class OperatorTotal(msgspec.Struct, frozen=True, gc=False):
    """One operator name's totals (us), as torch.profiler's table shows them: a row of a summary's
    ``top_cpu_ops`` / ``top_cpu_ops_by_self`` / ``top_ops_by_device`` (:func:`cpu_ops` says how)."""

    name: str
    calls: int
    cpu_total_us: float
    self_cpu_us: float
    device_total_us: float
    self_device_us: float


class ThreadBusy(msgspec.Struct, frozen=True, gc=False):
    """How busy one CPU thread was: the union of its top-level operators (us, and % of the span)."""

    pid: int | str
    tid: int | str
    busy_us: float
    busy_pct: float


class CpuThreads(msgspec.Struct, frozen=True):
    """A summary's ``cpu``: the traced span of the CPU operators and each thread's busy time,
    busiest first."""

    span_us: float
    threads: list[ThreadBusy]


def cpu_tree(trace: Trace) -> dict[str, np.ndarray]:
    """Nesting of CPU events per thread: parent index and depth (vectorised, no per-event loop).

    Events are sorted by (thread, start, longest first, file order); an event's depth is the
    number of earlier events of its thread still open at its start, its parent the closest earlier
    event of its thread one level up.  Threads are done one at a time, so temporaries are only as
    large as the busiest thread; the arrays kept are int32.  ``bounds`` delimits the threads:
    thread ``k``'s events are ``idx[bounds[k]:bounds[k + 1]]``, and parents never cross them.
    Kept in ``trace.memo``.
    """
    if trace.memo.cpu_tree is not None:
        return trace.memo.cpu_tree
    idx = _cpu_events(trace)
    thread = trace.thread_id[idx]
    counts = np.bincount(thread) if len(thread) else np.zeros(0, dtype=np.int64)
    present = np.flatnonzero(counts)
    if 1 < len(present) <= 16:  # a stable partition, one thread at a time (less memory than a sort)
        idx = np.concatenate([idx[thread == t] for t in present])
    elif len(present) > 1:  # int16 keys: numpy's stable sort is then a radix sort
        idx = idx[np.argsort(thread.astype(np.int16) if len(counts) < (1 << 15) else thread, kind="stable")]
    del thread
    n = len(idx)
    parent = np.full(n, -1, dtype=np.int32)
    depth = np.zeros(n, dtype=np.int32)
    bounds = np.r_[0, np.cumsum(counts[counts > 0])].astype(np.int64)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        _thread_tree(trace, idx, parent, depth, int(lo), int(hi))
    tree = {"idx": idx, "parent": parent, "depth": depth, "bounds": bounds}
    trace.memo.cpu_tree = tree
    return tree


def _cpu_events(trace: Trace) -> np.ndarray:
    """Indices (int32, file order) of the events of the operator tree, found in pieces so no
    int64 index array of the whole trace is ever built."""
    wanted = lookup(trace.cats, CPU_OP_CATS)
    pieces = []
    for lo in range(0, len(trace.cat_id), _PIECE * 4):
        hi = lo + _PIECE * 4
        mask = wanted[trace.cat_id[lo:hi]]
        mask &= trace.stream[lo:hi] == -1
        pieces.append((np.flatnonzero(mask) + lo).astype(np.int32))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)


def _fix_ties(trace: Trace, sel: np.ndarray, ts: np.ndarray, order: np.ndarray) -> None:
    """Among events with the same start (``ts`` sorted, ``order`` the stable sort), put the
    longest first, as ``np.lexsort((-end, ts))`` would, touching only the rare ties."""
    tie = ts[1:] == ts[:-1]
    if not tie.any():
        return
    in_group = np.zeros(len(ts), dtype=bool)
    in_group[1:] |= tie
    in_group[:-1] |= tie
    del tie
    pos = np.flatnonzero(in_group)
    sub = order[pos]
    events = sel[sub]
    end = trace.ts[events] + np.maximum(trace.dur[events], 0.0)
    order[pos] = sub[np.lexsort((-end, ts[pos]))]


def _thread_tree(trace: Trace, idx: np.ndarray, parent: np.ndarray, depth: np.ndarray, lo: int,
                 hi: int) -> None:
    """Sort ``idx[lo:hi]`` (one thread, in file order) in place and fill its parent / depth.

    Written for the busiest thread of a multi-GB trace: each temporary is dropped (or made
    int32) as soon as it has been used, so the peak stays near 24 bytes an event.
    """
    m = hi - lo
    sel = idx[lo:hi]
    ts = trace.ts[sel]
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    order = order.astype(np.int32)
    _fix_ties(trace, sel, ts, order)
    idx[lo:hi] = sel[order]
    del order, sel
    end = trace.dur[idx[lo:hi]]
    np.maximum(end, 0.0, out=end)
    end += ts
    end.sort(kind="stable")  # ends are nearly in start order: timsort is ~10x faster here
    d = np.searchsorted(end, ts, side="right")
    del ts, end
    np.negative(d, out=d)
    d += np.arange(m, dtype=np.int32)
    np.maximum(d, 0, out=d)
    d = d.astype(np.int32)
    # The parent of an event at depth k is the closest earlier event at depth k - 1.
    # Depths are small: a stable sort of int16 keys is a radix sort, ~5x faster than of int32.
    keys = d.astype(np.int16) if m and int(d.max()) < (1 << 15) else d
    by_depth = np.argsort(keys, kind="stable").astype(np.int32)
    del keys
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
_PIECE = 1 << 18
_OP_KEYS = ("calls", "cpu_total", "self_cpu", "device_total", "self_device")


def cpu_ops(trace: Trace) -> dict[str, np.ndarray]:
    """Per operator name: calls, CPU total, self CPU, device total, self device (all in us).

    Arrays indexed by name id.  Self CPU is an op's duration minus its children's; device time
    is that of the kernels the op launched (self) or that it and its descendants launched (total).
    Threads are done one at a time (parents never cross threads), in pieces, so the temporaries
    are about 8 bytes per event of the busiest thread.  Kept in ``trace.memo``.
    """
    if trace.memo.cpu_ops is not None:
        return trace.memo.cpu_ops
    tree = cpu_tree(trace)
    size = len(trace.names)
    out = {"calls": np.zeros(size, dtype=np.int64), **{k: np.zeros(size) for k in _OP_KEYS[1:]}}
    kernels = _launched_kernels(trace) if len(tree["idx"]) else None
    bounds = tree["bounds"]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        _thread_cpu_times(trace, tree, int(lo), int(hi), out)
        if kernels is not None:
            _thread_device_times(trace, tree, int(lo), int(hi), kernels, out)
    np.maximum(out["self_cpu"], 0.0, out=out["self_cpu"])  # overlapping children in a broken trace
    trace.memo.cpu_ops = out
    return out


def _pieces(lo: int, hi: int) -> list[tuple[int, int]]:
    return [(i, min(i + _PIECE, hi)) for i in range(lo, hi, _PIECE)]


def _thread_cpu_times(trace: Trace, tree: dict[str, np.ndarray], lo: int, hi: int,
                      out: dict[str, np.ndarray]) -> None:
    """Add calls, CPU total and self CPU per name of one thread's ops (``idx[lo:hi]``) to ``out``.

    Self CPU is torch.profiler's: an op's duration minus its children's, summed per name; the
    children's time is summed under their parent's name, so one pass does it.
    """
    idx, parent = tree["idx"], tree["parent"]
    size = len(trace.names)
    for a, b in _pieces(lo, hi):
        names, dur, up = trace.name_id[idx[a:b]], trace.dur[idx[a:b]], parent[a:b]
        out["calls"] += np.bincount(names, minlength=size)
        total = np.bincount(names, weights=dur, minlength=size)
        out["cpu_total"] += total
        has = up >= 0
        out["self_cpu"] += total - np.bincount(trace.name_id[idx[up[has]]], weights=dur[has], minlength=size)


def _launched_kernels(trace: Trace) -> tuple[np.ndarray, np.ndarray] | None:
    """Correlation ids and durations of the events with a CUDA stream (None when there are none)."""
    mask = trace.stream >= 0
    mask &= trace.corr >= 0
    if not mask.any():
        return None
    return trace.corr[mask], trace.dur[mask]


def _thread_device_times(trace: Trace, tree: dict[str, np.ndarray], lo: int, hi: int,
                         kernels: tuple[np.ndarray, np.ndarray], out: dict[str, np.ndarray]) -> None:
    """Add self / total device time per name of one thread's ops to ``out``.

    Each kernel counts for the CPU op around the runtime call that launched it (same
    correlation id), then every op's device time is pushed up to its ancestors.
    """
    idx, parent = tree["idx"], tree["parent"]
    corr = trace.corr[idx[lo:hi]]
    launchers = np.flatnonzero(corr >= 0).astype(np.int32)
    if len(launchers) == 0:
        return
    corr = corr[launchers]
    order = np.argsort(corr, kind="stable")
    corr = corr[order]
    launchers = launchers[order]
    del order
    kcorr, kdur = kernels
    pos = np.searchsorted(corr, kcorr)
    np.minimum(pos, len(corr) - 1, out=pos)
    found = corr[pos] == kcorr
    launcher = launchers[pos[found]] + lo
    del pos, corr, launchers
    up = parent[launcher]
    owner = np.where(up >= 0, up, launcher) - lo
    del up, launcher
    total_dev = np.bincount(owner, weights=kdur[found], minlength=hi - lo)
    del owner, found
    # Ops without device time add zero to the per-name sums: only visit the others.
    size = len(trace.names)
    nz = np.flatnonzero(total_dev)
    out["self_device"] += np.bincount(trace.name_id[idx[lo + nz]], weights=total_dev[nz], minlength=size)
    del nz
    _push_up(total_dev, parent[lo:hi] - lo, tree["depth"][lo:hi])
    nz = np.flatnonzero(total_dev)
    out["device_total"] += np.bincount(trace.name_id[idx[lo + nz]], weights=total_dev[nz], minlength=size)


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


def top_ops(trace: Trace, ops: dict[str, np.ndarray], key: str, top: int | None) -> list[OperatorTotal]:
    """The operator names with the largest totals.

    Args:
        trace: the trace.
        ops: its :func:`cpu_ops`.
        key: the total to sort by: ``cpu_total``, ``self_cpu`` or ``device_total``.
        top: names to keep (None: all that were called).

    Returns:
        The rows, largest first.
    """
    order = np.argsort(-ops[key], kind="stable")
    rows = []
    for i in order if top is None else order[: max(top, 0)]:
        if ops["calls"][i] == 0:
            break
        rows.append(OperatorTotal(
            name=trace.names[i], calls=int(ops["calls"][i]), cpu_total_us=float(ops["cpu_total"][i]),
            self_cpu_us=float(ops["self_cpu"][i]), device_total_us=float(ops["device_total"][i]),
            self_device_us=float(ops["self_device"][i])))
    return rows


def cpu_view(trace: Trace) -> CpuThreads | None:
    """Busy time per CPU thread: the union of its top-level operators over the traced span (None
    when the trace has no CPU operator)."""
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
        pct = 100.0 * busy / span if span > 0 else 0.0
        threads.append(ThreadBusy(pid=pid, tid=tid, busy_us=busy, busy_pct=pct))
    threads.sort(key=lambda r: -r.busy_us)
    return CpuThreads(span_us=span, threads=threads)
