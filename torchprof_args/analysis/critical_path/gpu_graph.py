"""The GPU side of a rank's dependency graph: kernels, their launches, and what waits for them.

* every kernel / copy / memset (HTA's idle-time selection: a stream and a kernel category) has a
  start and an end node, joined by its duration;
* kernels on one stream run in order: the previous one's end to the next one's start;
* a kernel cannot start before its launch call did (correlation id): every kernel launched by a
  CUDA graph (``cudaGraphLaunch``) shares the launch's correlation id and gets its edge too (HTA
  misses these, its issue #290);
* a blocking host call ends after what it waited for: a blocking device-to-host copy after its own
  copy, a ``cuda*Synchronize`` after the last kernel launched before it that ended before it
  returned;
* a kernel that started right after a kernel on another stream ended, later than its own stream
  and launch allowed, waited for it (``cudaStreamWaitEvent`` between streams: the traces of most
  torch versions do not say which event, so it is inferred from the times).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchprof_args.analysis.analyzers.event_names import COPY_RE, DTOH_RE, SYNC_RE
from torchprof_args.analysis.analyzers.gpu import COMMUNICATION, kernel_type
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import KERNEL_CATS, RUNTIME_CATS
from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.cpu_graph import CpuEvents
from torchprof_args.analysis.critical_path.edges import (
    INDEX,
    INFER,
    KERNEL,
    LAUNCH_EDGE,
    STREAM,
    SYNC,
    EdgeList,
)
from torchprof_args.analysis.critical_path.ranges import last_of_each, range_pairs
from torchprof_args.analysis.trace import Trace

__all__ = ["INFER_WINDOW_US", "Kernels", "gpu_edges", "gpu_events"]

#: a kernel that waited this much longer than its stream and launch needed ...
INFER_SLACK_US = 5.0
#: ... for a kernel on another stream that ended at most this long before it started, waited for it.
INFER_WINDOW_US = 15.0
#: a synchronisation returns at most this long after the kernel it waited for (clock jitter).
SYNC_TOLERANCE_US = 5.0


@dataclass
class Kernels:
    """The GPU events of the graph, sorted by start: nodes, stream, category, launch position."""

    events: np.ndarray
    start_node: np.ndarray
    end_node: np.ndarray
    stream: np.ndarray
    category: np.ndarray
    launch: np.ndarray

    def __len__(self) -> int:
        return len(self.events)


def _positions(trace: Trace, cpu: CpuEvents) -> np.ndarray:
    """Event index -> CPU position (-1)."""
    out = np.full(len(trace.ts), -1, dtype=np.int64)
    out[cpu.events] = np.arange(len(cpu), dtype=np.int64)
    return out


def gpu_events(trace: Trace, cpu: CpuEvents, first_node: int) -> Kernels:
    """The kernels of ``trace`` with their nodes (``first_node`` ...) and launches; marks the launch
    calls of device-to-host copies as blocking in ``cpu``."""
    is_kernel = lookup(trace.cats, KERNEL_CATS)[trace.cat_id] & (trace.stream >= 0)
    events = np.flatnonzero(is_kernel).astype(INDEX)
    events = events[np.argsort(trace.ts[events], kind="stable")]
    m = len(events)
    names = trace.name_id[events]
    comm = lookup(trace.names, lambda n: kernel_type(n) == COMMUNICATION)[names]
    copy = lookup(trace.names, lambda n: bool(COPY_RE.search(n)) or n.startswith(("Memset", "Memcpy")))[names]
    category = np.where(comm, cat.COMMUNICATION, np.where(copy, cat.MEMCPY, cat.COMPUTE)).astype(np.int8)
    launch = _launch_positions(trace, cpu, events)
    dtoh = lookup(trace.names, DTOH_RE.search)[names] & (launch >= 0)
    cpu.blocking[launch[dtoh]] = True
    return Kernels(events, np.arange(first_node, first_node + m, dtype=INDEX),
                   np.arange(first_node + m, first_node + 2 * m, dtype=INDEX),
                   trace.stream[events].astype(INDEX), category, launch)


def _launch_positions(trace: Trace, cpu: CpuEvents, kernels: np.ndarray) -> np.ndarray:
    """Per kernel, the CPU position of the runtime call with its correlation id (-1)."""
    out = np.full(len(kernels), -1, dtype=np.int64)
    runtime = lookup(trace.cats, RUNTIME_CATS)[trace.cat_id[cpu.events]] & (trace.corr[cpu.events] >= 0)
    pos = np.flatnonzero(runtime)
    if not len(pos) or not len(kernels):
        return out
    corr = trace.corr[cpu.events[pos]]
    order = np.argsort(corr, kind="stable")
    corr, pos = corr[order], pos[order]
    want = trace.corr[kernels]
    at = np.minimum(np.searchsorted(corr, want), len(corr) - 1)
    found = (corr[at] == want) & (want >= 0)
    out[found] = pos[at[found]]
    return out


def gpu_edges(trace: Trace, cpu: CpuEvents, kernels: Kernels, edges: EdgeList) -> None:
    """Add the kernel, stream, launch, synchronisation and inferred cross-stream edges."""
    if not len(kernels):
        return
    ts = trace.ts[kernels.events]
    end = ts + np.maximum(trace.dur[kernels.events], 0.0)
    edges.add(kernels.start_node, kernels.end_node, end - ts, KERNEL, kernels.category, kernels.events)
    by_stream = np.lexsort((ts, kernels.stream))
    same = kernels.stream[by_stream][1:] == kernels.stream[by_stream][:-1]
    prev, nxt = by_stream[:-1][same], by_stream[1:][same]
    edges.add(kernels.end_node[prev], kernels.start_node[nxt], 0.0, STREAM, cat.LAUNCH, kernels.events[nxt])
    launched = np.flatnonzero(kernels.launch >= 0)
    edges.add(cpu.start_node[kernels.launch[launched]], kernels.start_node[launched], 0.0, LAUNCH_EDGE,
              cat.LAUNCH, kernels.events[launched])
    _sync_edges(trace, cpu, kernels, ts, end, edges)
    _inferred_edges(trace, cpu, kernels, ts, end, prev, nxt, edges)


def _sync_edges(trace: Trace, cpu: CpuEvents, kernels: Kernels, ts: np.ndarray, end: np.ndarray,
                edges: EdgeList) -> None:
    """A blocking copy's call waits for its copy; a synchronisation for the last kernel launched
    before it that ended before it returned."""
    copies = np.flatnonzero((kernels.launch >= 0) & cpu.blocking[np.maximum(kernels.launch, 0)])
    edges.add(kernels.end_node[copies], cpu.end_node[kernels.launch[copies]], 0.0, SYNC, cat.HOST_SYNC,
              cpu.events[kernels.launch[copies]])
    names = trace.name_id[cpu.events]
    syncs = np.flatnonzero(lookup(trace.names, SYNC_RE.match)[names])
    if not len(syncs):
        return
    launched_at = np.where(kernels.launch >= 0, trace.ts[cpu.events[np.maximum(kernels.launch, 0)]], ts)
    by_end = np.argsort(end, kind="stable")
    ends = end[by_end]
    src, dst, owner = [], [], []
    for k in syncs.tolist():
        e = cpu.events[k]
        call_start, call_end = float(trace.ts[e]), float(trace.ts[e] + trace.dur[e])
        j = int(np.searchsorted(ends, call_end + SYNC_TOLERANCE_US, side="right")) - 1
        for _ in range(256):  # the last-ending kernel launched before the call
            if j < 0 or ends[j] < call_start:
                break
            if launched_at[by_end[j]] < call_start:
                src.append(kernels.end_node[by_end[j]])
                dst.append(cpu.end_node[k])
                owner.append(e)
                break
            j -= 1
    edges.add(np.array(src, np.int64), np.array(dst, np.int64), 0.0, SYNC, cat.HOST_SYNC,
              np.array(owner, np.int64))


def _inferred_edges(trace: Trace, cpu: CpuEvents, kernels: Kernels, ts: np.ndarray, end: np.ndarray,
                    prev: np.ndarray, nxt: np.ndarray, edges: EdgeList) -> None:
    """Kernels that waited for a kernel on another stream (see the module's docstring)."""
    ready = np.full(len(kernels), -np.inf)
    ready[nxt] = end[prev]
    has_launch = kernels.launch >= 0
    launch_ts = trace.ts[cpu.events[np.maximum(kernels.launch, 0)]]
    ready = np.where(has_launch, np.maximum(ready, launch_ts), ready)
    late = np.flatnonzero(np.isfinite(ready) & (ts - ready > INFER_SLACK_US))
    if not len(late):
        return
    by_end = np.argsort(end, kind="stable")
    ends = end[by_end]
    # per late kernel, the kernels that ended in the window before it started (a range of ``ends``);
    # of those on another stream that ended after it was ready, the last to end: candidate pairs in
    # chunks (the window is short: a few kernels each), the last per kernel
    hi = np.searchsorted(ends, ts[late], side="right")
    lo = np.searchsorted(ends, ts[late] - INFER_WINDOW_US, side="left")
    src, dst = [], []
    for which, j in range_pairs(lo, hi):
        i, other = late[which], by_end[j]
        ok = (kernels.stream[other] != kernels.stream[i]) & (ends[j] > ready[i])
        which, j = which[ok], j[ok]
        last = last_of_each(which)
        src.append(kernels.end_node[by_end[j[last]]])
        dst.append(late[which[last]])
    found = np.concatenate(dst) if dst else np.zeros(0, np.int64)
    edges.add(np.concatenate(src) if src else np.zeros(0, np.int64), kernels.start_node[found], 0.0, INFER,
              cat.LAUNCH, kernels.events[found])
