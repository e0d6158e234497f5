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


def _name_types(trace: Trace) -> np.ndarray:
    cached = trace._cache.get("name_types")
    if cached is None:
        cached = np.array([kernel_type(n) for n in trace.names] or [OTHER], dtype=object)
        trace._cache["name_types"] = cached
    return cached


def _ids(table: list[str], wanted: set[str] | tuple[str, ...]) -> np.ndarray:
    return np.array([i for i, x in enumerate(table) if x in wanted], dtype=np.int32)


def _hta_kernels(trace: Trace) -> tuple[np.ndarray, bool]:
    """Mask of the events HTA's analyses treat as kernels, and whether the last step was dropped."""
    valid = ~np.isin(trace.cat_id, _ids(trace.cats, ("Trace",)))
    sync = np.isin(trace.name_id, _ids(trace.names, ("Event Sync", "Context Sync")))
    is_gpu = ((trace.stream >= 0) & (trace.corr >= 0)) | sync
    step_ids = np.array([i for i, n in enumerate(trace.names) if "ProfilerStep" in n], dtype=np.int32)
    has_stream = trace.stream != -1
    if len(step_ids) < 2:
        return valid & has_stream, False
    ts = np.ceil(trace.ts)
    cpu = valid & ~is_gpu
    step_starts = ts[cpu & np.isin(trace.name_id, step_ids)]
    if len(step_starts) == 0:
        return np.zeros(len(ts), dtype=bool), True
    kept_cpu = cpu & (ts < step_starts.max())
    kept_corr = np.unique(trace.corr[kept_cpu])
    kernels = (valid & is_gpu & np.isin(trace.corr, kept_corr)) | kept_cpu
    return kernels & has_stream, True


def gpu_view(trace: Trace, top: int = 30) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """HTA-comparable GPU breakdown (``None`` without kernels) and the top kernels."""
    mask, dropped_last = _hta_kernels(trace)
    if not mask.any():
        return None, []
    ts = np.ceil(trace.ts[mask])
    end = np.floor(trace.ts[mask] + trace.dur[mask])
    name_id = trace.name_id[mask]
    types = _name_types(trace)[name_id]

    starts, ends = merge_intervals(ts, end)
    span = float(ends[-1] - starts[0])
    busy = float((ends - starts).sum())
    idle = span - busy
    merged = {t: merge_intervals(ts[types == t], end[types == t]) for t in (COMPUTATION, COMMUNICATION, MEMORY)}
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
        "kernels": int(mask.sum()),
        "streams": sorted(int(s) for s in np.unique(trace.stream[mask])),
        "last_step_excluded": dropped_last,
    }
    return gpu, _top_kernels(trace, mask, top)


def _top_kernels(trace: Trace, mask: np.ndarray, top: int) -> list[dict[str, Any]]:
    name_id = trace.name_id[mask]
    dur = trace.dur[mask]
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

    Events are sorted by (thread, start, longest first); an event's depth is the number of
    earlier events of its thread still open at its start, its parent the closest earlier event
    one level up.  Arrays are int32 and temporaries are freed early: this runs on millions of ops.
    """
    cached = trace._cache.get("cpu_tree")
    if cached is not None:
        return cached
    idx = np.flatnonzero(np.isin(trace.cat_id, _ids(trace.cats, CPU_OP_CATS)) & (trace.stream == -1)).astype(np.int32)
    n = len(idx)
    parent = np.full(n, -1, dtype=np.int32)
    depth = np.zeros(n, dtype=np.int32)
    if n:
        ts = trace.ts[idx]
        end = ts + np.maximum(trace.dur[idx], 0.0)
        thread = trace.thread_id[idx]
        order = np.lexsort((-end, ts, thread))
        idx, thread = idx[order], thread[order]
        lo = float(min(ts.min(), 0.0))
        width = float(end.max() - lo) * 2 + 10.0
        off = thread.astype(np.float64) * width - lo
        s_key = ts[order] + off
        e_key = end[order] + off
        del ts, end, order, off
        e_key.sort()
        depth = np.maximum(np.arange(n, dtype=np.int64) - np.searchsorted(e_key, s_key, side="right"), 0).astype(np.int32)
        del s_key, e_key
        # The parent of an event at depth d is the closest earlier event at depth d - 1.
        levels = np.unique(depth)
        by_depth = {int(d): np.flatnonzero(depth == d).astype(np.int32) for d in levels}
        for d in levels[::-1]:
            d = int(d)
            members, above = by_depth[d], by_depth.get(d - 1)
            if d == 0 or above is None:
                continue
            cand = above[np.maximum(np.searchsorted(above, members) - 1, 0)]
            ok = (cand < members) & (thread[cand] == thread[members])
            parent[members[ok]] = cand[ok]
            depth[members[~ok]] = 0
    tree = {"idx": idx, "parent": parent, "depth": depth}
    trace._cache["cpu_tree"] = tree
    return tree


def cpu_ops(trace: Trace) -> dict[str, np.ndarray]:
    """Per operator name: calls, CPU total, self CPU, device total, self device (all in us)."""
    tree = _cpu_tree(trace)
    idx, parent = tree["idx"], tree["parent"]
    n = len(idx)
    dur = trace.dur[idx]
    has_parent = parent >= 0
    child_sum = np.bincount(parent[has_parent], weights=dur[has_parent], minlength=n) if n else np.zeros(0)
    self_cpu = np.maximum(dur - child_sum, 0.0)

    # Device time: each kernel counts for the CPU op around the runtime call that launched it.
    self_dev = np.zeros(n)
    kmask = (trace.stream >= 0) & (trace.corr >= 0)
    if n and kmask.any():
        rt_corr = trace.corr[idx]
        has_corr = np.flatnonzero(rt_corr >= 0)
        order = has_corr[np.argsort(rt_corr[has_corr], kind="stable")]
        sorted_corr = rt_corr[order]
        kcorr = trace.corr[kmask]
        kdur = trace.dur[kmask]
        pos = np.searchsorted(sorted_corr, kcorr)
        pos = np.minimum(pos, max(len(sorted_corr) - 1, 0))
        found = (len(sorted_corr) > 0) & (sorted_corr[pos] == kcorr) if len(sorted_corr) else np.zeros(len(kcorr), bool)
        launcher = order[pos[found]]
        owner = np.where(parent[launcher] >= 0, parent[launcher], launcher)
        self_dev = np.bincount(owner, weights=kdur[found], minlength=n).astype(np.float64)
    total_dev = self_dev.copy()
    depth = tree["depth"]
    if n:
        for d in range(int(depth.max()), 0, -1):
            members = np.flatnonzero((depth == d) & has_parent)
            np.add.at(total_dev, parent[members], total_dev[members])
    names = trace.name_id[idx]
    size = len(trace.names)
    return {
        "calls": np.bincount(names, minlength=size),
        "cpu_total": np.bincount(names, weights=dur, minlength=size),
        "self_cpu": np.bincount(names, weights=self_cpu, minlength=size),
        "device_total": np.bincount(names, weights=total_dev, minlength=size),
        "self_device": np.bincount(names, weights=self_dev, minlength=size),
    }


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
    ids = np.array([i for i, n in enumerate(trace.names) if STEP_RE.match(n)], dtype=np.int32)
    idx = np.flatnonzero(np.isin(trace.name_id, ids) & (trace.stream == -1))
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
