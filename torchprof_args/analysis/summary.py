"""Per-rank and cross-rank summaries of a loaded trace, with HTA's definitions.

GPU numbers follow Holistic Trace Analysis (``hta`` 0.5) so they can be compared:

* kernels are events with a CUDA ``stream``; when the trace has two or more ``ProfilerStep``
  names, only kernels launched (same correlation id) by CPU events that start before the last
  ProfilerStep are kept, plus stream-bearing CPU-side events before it (HTA drops the last,
  usually incomplete, step);
* times are rounded like HTA's parser: ``ts = ceil(ts)``, ``end = floor(ts + dur)``;
* kernel class by name: communication ``^nccl.*Kernel``, memory ``^Memcpy|^Memset|^dma``,
  computation = not matching ``^nccl.*Kernel|.*Memcpy|Memset|.*Sync`` (the rest is "other");
* idle = kernel-active span (first kernel start to last end) minus the union of kernel
  intervals; compute = union of computation kernels; non-compute = span - compute - idle;
* kernel-type totals are exclusive: time where several classes run at once is reported under
  the combined class ("computation overlapping communication") as HTA does;
* overlap = time computation and communication kernels run at once / communication union time.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from torchprof_args.analysis.trace import Trace

COMM_RE = re.compile(r"^nccl.*Kernel")
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
STEP_RE = re.compile(r"^ProfilerStep#\d+$")
CPU_OP_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
COMPUTATION, COMMUNICATION, MEMORY, OTHER = "computation", "communication", "memory", "other"
_TYPE_BITS = {COMPUTATION: 1, COMMUNICATION: 2, MEMORY: 4}


def kernel_type(name: str) -> str:
    """HTA's ``get_kernel_type``: communication, memory, computation or other."""
    if COMM_RE.match(name):
        return COMMUNICATION
    if MEMORY_RE.match(name):
        return MEMORY
    if not NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as HTA's ``merge_kernel_intervals`` computes it (sorted starts/ends)."""
    if len(ts) == 0:
        return ts, end
    order = np.argsort(ts, kind="stable")
    t, e = ts[order], end[order]
    new = np.empty(len(t), dtype=bool)
    new[0] = True
    new[1:] = t[1:] > np.maximum.accumulate(e)[:-1]
    idx = np.flatnonzero(new)
    return t[idx], np.maximum.reduceat(e, idx)


def _sweep(intervals: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, float]:
    """Time spent in each combination (bitmask) of the given interval sets."""
    times, deltas = [], []
    for bit, (s, e) in intervals.items():
        times += [s, e]
        deltas += [np.full(len(s), bit, dtype=np.int64), np.full(len(e), -bit, dtype=np.int64)]
    if not times:
        return {}
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    order = np.argsort(t, kind="stable")
    t, running = t[order], np.cumsum(d[order])
    seg = np.diff(t)
    state = running[:-1]
    out: dict[int, float] = {}
    for value in np.unique(state):
        if value > 0:
            out[int(value)] = float(seg[state == value].sum())
    return out


_TYPE_CODES = {COMPUTATION: 1, COMMUNICATION: 2, MEMORY: 3, OTHER: 0}


def _name_codes(trace: Trace) -> np.ndarray:
    """Kernel class of every name as a small integer (see ``_TYPE_CODES``)."""
    cached = trace._cache.get("name_codes")
    if cached is None:
        cached = np.array([_TYPE_CODES[str(t)] for t in _name_types(trace)], dtype=np.int8)
        trace._cache["name_codes"] = cached
    return cached


def _name_types(trace: Trace) -> np.ndarray:
    cached = trace._cache.get("name_types")
    if cached is None:
        cached = np.array([kernel_type(n) for n in trace.names] or [OTHER], dtype=object)
        trace._cache["name_types"] = cached
    return cached


def _lookup(table: list[str], wanted: Any) -> np.ndarray:
    """Boolean table indexed by id: ``_lookup(trace.names, pred)[trace.name_id]`` is a mask.

    Cheaper than ``np.isin`` on millions of ids (no sort, no temporaries).  ``wanted`` is a
    collection of strings or a predicate.
    """
    test = wanted if callable(wanted) else wanted.__contains__
    return np.array([bool(test(x)) for x in table] + [False], dtype=bool)


def _member(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``np.isin(values, wanted)`` for integers, through a bitmap when their range is compact."""
    if len(values) == 0 or len(wanted) == 0:
        return np.zeros(len(values), dtype=bool)
    lo = int(min(values.min(), wanted.min()))
    hi = int(max(values.max(), wanted.max()))
    if hi - lo > 8 * (len(values) + len(wanted)) + (1 << 20):
        return np.isin(values, wanted)
    bitmap = np.zeros(hi - lo + 1, dtype=bool)
    bitmap[wanted - lo if lo else wanted] = True
    return bitmap[values - lo] if lo else bitmap[values]


def _hta_kernels(trace: Trace) -> tuple[np.ndarray, bool]:
    """Mask of the events HTA's analyses treat as kernels, and whether the last step was dropped."""
    valid = ~_lookup(trace.cats, ("Trace",))[trace.cat_id]
    sync = _lookup(trace.names, ("Event Sync", "Context Sync"))[trace.name_id]
    is_gpu = ((trace.stream >= 0) & (trace.corr >= 0)) | sync
    del sync
    is_step = _lookup(trace.names, lambda n: "ProfilerStep" in n)
    has_stream = trace.stream != -1
    if int(is_step.sum()) < 2:
        return valid & has_stream, False
    cpu = valid & ~is_gpu
    kernels = valid & is_gpu
    del valid, is_gpu
    step_starts = trace.ts[cpu & is_step[trace.name_id]]
    if len(step_starts) == 0:
        return np.zeros(len(trace.ts), dtype=bool), True
    # HTA compares ceil(ts) < ceil(last step start); for an integer m, ceil(t) < m <=> t <= m - 1.
    kept_cpu = cpu & (trace.ts <= float(np.ceil(step_starts).max()) - 1.0)
    del cpu
    kept_corr = trace.corr[kept_cpu]
    kernels[kernels] = _member(trace.corr[kernels], kept_corr)
    kernels |= kept_cpu
    return kernels & has_stream, True


def gpu_view(trace: Trace, top: int = 30) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """HTA-comparable GPU breakdown (``None`` without kernels) and the top kernels."""
    mask, dropped_last = _hta_kernels(trace)
    if not mask.any():
        return None, []
    sel = np.flatnonzero(mask)
    del mask
    ts = np.ceil(trace.ts[sel])
    end = np.floor(trace.ts[sel] + trace.dur[sel])
    codes = _name_codes(trace)[trace.name_id[sel]]
    kernels = len(sel)
    streams = sorted(int(x) for x in np.unique(trace.stream[sel]))

    starts, ends = merge_intervals(ts, end)
    span = float(ends[-1] - starts[0])
    busy = float((ends - starts).sum())
    idle = span - busy
    del starts, ends
    merged = {}
    for t in (COMPUTATION, COMMUNICATION, MEMORY):
        of_type = codes == _TYPE_CODES[t]
        merged[t] = merge_intervals(ts[of_type], end[of_type])
    del ts, end, codes
    compute = float((merged[COMPUTATION][1] - merged[COMPUTATION][0]).sum())
    non_compute = span - compute - idle
    comm_total = float((merged[COMMUNICATION][1] - merged[COMMUNICATION][0]).sum())
    both = _sweep({1: merged[COMMUNICATION], 2: merged[COMPUTATION]}).get(3, 0.0)
    overlap_pct = 100.0 * both / comm_total if comm_total > 0 else None

    exclusive = _sweep({bit: merged[t] for t, bit in _TYPE_BITS.items()})
    kernel_type_us = {t: exclusive.get(bit, 0.0) for t, bit in _TYPE_BITS.items()}
    overlapping: dict[str, float] = {}
    for mask_value, total in sorted(exclusive.items()):
        parts = [t for t, bit in _TYPE_BITS.items() if mask_value & bit]
        if len(parts) > 1:
            overlapping[" overlapping ".join(parts)] = total

    def pct(x: float) -> float:
        return 100.0 * x / span if span > 0 else 0.0

    gpu = {
        "kernel_active_span_us": span,
        "busy_us": busy,
        "idle_us": idle,
        "compute_us": compute,
        "non_compute_us": non_compute,
        "idle_pct": pct(idle),
        "compute_pct": pct(compute),
        "non_compute_pct": pct(non_compute),
        "communication_us": comm_total,
        "comm_comp_overlap_us": both,
        "comm_comp_overlap_pct": overlap_pct,
        "kernel_type_us": kernel_type_us,
        "kernel_type_overlapping_us": overlapping,
        "kernels": kernels,
        "streams": streams,
        "last_step_excluded": dropped_last,
    }
    return gpu, _top_kernels(trace, sel, top)


def _top_kernels(trace: Trace, sel: np.ndarray, top: int) -> list[dict[str, Any]]:
    name_id = trace.name_id[sel]
    dur = trace.dur[sel]
    total = np.bincount(name_id, weights=dur, minlength=len(trace.names))
    count = np.bincount(name_id, minlength=len(trace.names))
    order = np.argsort(-total, kind="stable")[: max(top, 0)]
    types = _name_types(trace)
    grand = float(dur.sum()) or 1.0
    return [
        {
            "name": trace.names[i],
            "type": str(types[i]),
            "calls": int(count[i]),
            "total_us": float(total[i]),
            "mean_us": float(total[i] / count[i]),
            "pct": 100.0 * float(total[i]) / grand,
        }
        for i in order
        if count[i] > 0
    ]


def _cpu_tree(trace: Trace) -> dict[str, np.ndarray]:
    """Nesting of CPU events per thread: parent index and depth (vectorised, no per-event loop).

    Events are sorted by (thread, start, longest first, file order); an event's depth is the
    number of earlier events of its thread still open at its start, its parent the closest earlier
    event of its thread one level up.  Threads are done one at a time, so temporaries are only as
    large as the busiest thread; the arrays kept are int32.
    """
    cached = trace._cache.get("cpu_tree")
    if cached is not None:
        return cached
    mask = _lookup(trace.cats, CPU_OP_CATS)[trace.cat_id]
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


def cpu_ops(trace: Trace) -> dict[str, np.ndarray]:
    """Per operator name: calls, CPU total, self CPU, device total, self device (all in us).

    Works on millions of ops in pieces: one float array of their size is alive at a time, plus
    piece-sized temporaries.  ``np.add.at`` over consecutive pieces adds in the same order as one
    ``np.bincount`` over everything, so the sums are bit-identical to a one-pass computation.
    """
    tree = _cpu_tree(trace)
    idx, parent = tree["idx"], tree["parent"]
    n = len(idx)
    size = len(trace.names)
    out = {k: np.zeros(size) for k in ("cpu_total", "self_cpu", "device_total", "self_device")}
    out["calls"] = np.zeros(size, dtype=np.int64)
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
    del child

    # Device time: each kernel counts for the CPU op around the runtime call that launched it.
    kmask = (trace.stream >= 0) & (trace.corr >= 0)
    if n == 0 or not kmask.any():
        return {k: out[k] for k in ("calls", "cpu_total", "self_cpu", "device_total", "self_device")}
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
    return {k: out[k] for k in ("calls", "cpu_total", "self_cpu", "device_total", "self_device")}


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` for arrays made of a few sorted runs (timsort merges them in linear time)."""
    values = np.sort(values, kind="stable")
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _push_up(total: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> None:
    """Add every op's total into its parent's, deepest level first (in place).

    Only ops with a non-zero total take part (adding zero changes nothing), so the work and the
    temporaries scale with the ops that launched kernels and their ancestors, not with all ops.
    Within a level, additions happen in index order, as a dense pass would do them.
    """
    active = np.flatnonzero(total)
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
        members = members[(parent[members] >= 0) & (total[members] != 0)]
        if len(members) == 0:
            continue
        up = parent[members]
        np.add.at(total, up, total[members])
        above = levels.get(d - 1)
        levels[d - 1] = _sorted_unique(up if above is None else np.concatenate((above, up)))


def _op_rows(trace: Trace, ops: dict[str, np.ndarray], key: str, top: int) -> list[dict[str, Any]]:
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


def steps(trace: Trace) -> list[dict[str, Any]]:
    """ProfilerStep#N annotations on the CPU, in time order (first occurrence of each name)."""
    is_step = _lookup(trace.names, STEP_RE.match)
    idx = np.flatnonzero(is_step[trace.name_id])
    idx = idx[trace.stream[idx] == -1]
    idx = idx[np.argsort(trace.ts[idx], kind="stable")]
    out, seen = [], set()
    for i in idx:
        name = trace.names[trace.name_id[i]]
        if name in seen:
            continue
        seen.add(name)
        out.append({"name": name, "start_us": float(trace.ts[i]), "dur_us": float(trace.dur[i])})
    return out


def cpu_view(trace: Trace) -> dict[str, Any] | None:
    """Busy time per CPU thread: union of its top-level operators over the traced span."""
    tree = _cpu_tree(trace)
    if len(tree["idx"]) == 0:
        return None
    top = tree["idx"][tree["depth"] == 0]
    ts, thread = trace.ts[top], trace.thread_id[top]
    end = ts + np.maximum(trace.dur[top], 0.0)
    span = float(end.max() - ts.min())
    threads = []
    for t in np.unique(thread):
        sel = thread == t
        s, e = merge_intervals(ts[sel], end[sel])
        busy = float((e - s).sum())
        pid, tid = trace.threads[int(t)]
        threads.append(
            {"pid": pid, "tid": tid, "busy_us": busy, "busy_pct": 100.0 * busy / span if span > 0 else 0.0}
        )
    threads.sort(key=lambda r: -r["busy_us"])
    return {"span_us": span, "threads": threads}


def memory_view(trace: Trace) -> list[dict[str, Any]]:
    """Peak allocated / reserved bytes per device from ``[memory]`` instant events."""
    mem = trace.memory
    out = []
    for code in np.unique(mem["device"]):
        sel = mem["device"] == code
        dev_type, dev_id = divmod(int(code), 65536)
        dev_id -= 1
        kind = {0: "cpu", 1: "cuda"}.get(dev_type, f"device{dev_type}")
        label = kind if dev_id < 0 or kind == "cpu" else f"{kind}:{dev_id}"
        out.append(
            {
                "device": label,
                "peak_allocated_bytes": int(mem["allocated"][sel].max()),
                "peak_reserved_bytes": int(mem["reserved"][sel].max()),
                "samples": int(sel.sum()),
            }
        )
    return out


def summarize(trace: Trace, top: int = 30) -> dict[str, Any]:
    """Everything ``torchprof summary --json`` prints for one trace (JSON-serialisable dict)."""
    gpu, top_kernels = gpu_view(trace, top)
    ops = cpu_ops(trace)
    step_list = steps(trace)
    durs = [s["dur_us"] for s in step_list]
    return {
        "file": str(trace.path),
        "rank": trace.rank,
        "world_size": trace.world_size,
        "backend": (trace.metadata.get("distributedInfo") or {}).get("backend"),
        "base_time_ns": trace.base_time_ns,
        "events": trace.n_events,
        "uncompressed_bytes": trace.uncompressed_bytes,
        "steps": [{"name": s["name"], "dur_us": s["dur_us"]} for s in step_list],
        "step_mean_us": float(np.mean(durs)) if durs else None,
        "gpu": gpu,
        "cpu": cpu_view(trace),
        "top_kernels": top_kernels,
        "top_cpu_ops": _op_rows(trace, ops, "cpu_total", top),
        "top_cpu_ops_by_self": _op_rows(trace, ops, "self_cpu", top),
        "top_ops_by_device": _op_rows(trace, ops, "device_total", top) if gpu is not None else [],
        "memory": memory_view(trace),
    }


def cross_rank(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time per rank, the slowest rank and the spread, for a directory of per-rank traces."""
    rows = []
    for i, s in enumerate(summaries):
        rank = s["rank"] if s["rank"] is not None else i
        gpu = s["gpu"] or {}
        rows.append(
            {
                "rank": rank,
                "file": s["file"],
                "step_mean_us": s["step_mean_us"],
                "steps": len(s["steps"]),
                "idle_pct": gpu.get("idle_pct"),
                "comm_comp_overlap_pct": gpu.get("comm_comp_overlap_pct"),
            }
        )
    timed = [r for r in rows if r["step_mean_us"] is not None]
    out: dict[str, Any] = {"ranks": rows, "slowest_rank": None, "fastest_rank": None, "spread_pct": None}
    if timed:
        slow = max(timed, key=lambda r: r["step_mean_us"])
        fast = min(timed, key=lambda r: r["step_mean_us"])
        mean = float(np.mean([r["step_mean_us"] for r in timed]))
        out.update(
            slowest_rank=slow["rank"],
            fastest_rank=fast["rank"],
            step_mean_us=mean,
            spread_pct=100.0 * (slow["step_mean_us"] - fast["step_mean_us"]) / mean if mean > 0 else 0.0,
        )
    return out


def finite(value: Any) -> Any:
    """Replace NaN/inf by None recursively so the result is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
