"""The CPU side of a rank's dependency graph: every thread's events as one chain of boundaries.

Each CPU event (operator, annotation, runtime call; :func:`~..analyzers.cpu_ops.cpu_tree`'s) has a
start and an end node.  On each thread the boundaries, in time order with nesting respected, form a
chain: consecutive boundaries are joined by an edge carrying the thread's time between them,
attributed to the innermost event open then (HTA's nesting edges, with the time between top-level
operators kept: it is Python the step runs, and it is on the path as much as any operator).

Not every interval is work:

* inside a blocking host call (``cudaStreamSynchronize``, a blocking device-to-host copy) the thread
  waits: nominal weight 0, the device work it waited for is a separate edge (:mod:`.gpu_graph`);
* a gap on a thread that runs no step (gloo's worker, a loader thread) is the thread idling until
  work arrives: nominal weight 0;
* a gap during which a collective of the same process ran and that ends right after the collective
  ended is the thread waiting for it (``work.wait()``, DDP waiting for its all-reduce): nominal
  weight 0 and a ``WAIT`` edge from the collective's end.  gloo's span of a collective also gets an
  ``ISSUE`` edge from the c10d operator that issued it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from torchprof_args.analysis.analyzers.collectives import (
    are_metrics,
    backend_of,
    canonical_kind,
    match_issues,
    run_kind,
)
from torchprof_args.analysis.analyzers.cpu_ops import cpu_tree
from torchprof_args.analysis.analyzers.event_names import (
    COLLECTIVE_ISSUE_RE,
    COLLECTIVE_RUN_RE,
    COLLECTIVE_WAIT_RE,
    LAUNCH_RE,
    LOADER_RE,
    SYNC_RE,
)
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.steps import STEP_RE
from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.edges import CHAIN, INDEX, ISSUE, WAIT, WAKE, EdgeList
from torchprof_args.analysis.critical_path.ranges import first_of_each, range_pairs
from torchprof_args.analysis.critical_path.sorting import stable_order
from torchprof_args.analysis.trace import Trace

__all__ = ["RESUME_US", "CpuEvents", "cpu_edges", "cpu_events"]

#: a thread that resumes within this long (or a tenth of its gap) after a collective of its process
#: ended was waiting for it.
RESUME_US = 500.0
#: a thread quiet for less than this was not waiting.
MIN_QUIET_US = 50.0
#: ... or, for a collective it issued, within this share of its gap.
ISSUED_RESUME_SHARE = 0.5
#: top-level events on a thread that runs no step, less than this apart, are one burst of activity.
BURST_GAP_US = 200.0
_SYNC_COPY_RE = re.compile(r"^(cudaMemcpy|hipMemcpy|cudaMemcpy2D|cudaMemcpyFromSymbol)$")
#: a host polling the device (its time is host synchronisation, not work).
_POLL_RE = re.compile(r"^(cuda|hip)(Event|Stream)Query$")


@dataclass
class CpuEvents:
    """The CPU events of the graph, in :func:`cpu_tree` order (position ``k``).

    ``start_node[k]`` / ``end_node[k]``: its nodes; ``parent[k]``: its parent's position (-1);
    flags by position.  ``blocking`` is filled by :mod:`.gpu_graph` (a launch call of a
    device-to-host copy blocks too) before :func:`cpu_edges` runs.
    """

    events: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    thread: np.ndarray
    start_node: np.ndarray
    end_node: np.ndarray
    loader: np.ndarray
    blocking: np.ndarray
    polling: np.ndarray
    launch: np.ndarray
    run: np.ndarray
    issue: np.ndarray
    step: np.ndarray
    main_thread: int

    def __len__(self) -> int:
        return len(self.events)


def cpu_events(trace: Trace, first_node: int = 0) -> CpuEvents:
    """The CPU events of ``trace`` with their nodes (``first_node`` ...) and flags."""
    tree = cpu_tree(trace)
    events = tree["idx"].astype(INDEX)
    n = len(events)
    names = trace.name_id[events]
    thread = trace.thread_id[events].astype(INDEX)
    step = lookup(trace.names, STEP_RE.match)[names]
    threads_with_steps = thread[step]
    if len(threads_with_steps):
        main = int(np.bincount(threads_with_steps).argmax())
    elif n:
        main = int(np.bincount(thread, weights=trace.dur[events]).argmax())
    else:
        main = -1
    return CpuEvents(
        events=events, parent=tree["parent"].astype(INDEX), depth=tree["depth"].astype(INDEX),
        thread=thread, start_node=np.arange(first_node, first_node + n, dtype=INDEX),
        end_node=np.arange(first_node + n, first_node + 2 * n, dtype=INDEX),
        loader=lookup(trace.names, LOADER_RE.search)[names],
        blocking=lookup(trace.names, lambda s: bool(SYNC_RE.match(s) or _SYNC_COPY_RE.match(s)))[names],
        polling=lookup(trace.names, _POLL_RE.match)[names],
        launch=lookup(trace.names, LAUNCH_RE.match)[names],
        run=lookup(trace.names, COLLECTIVE_RUN_RE.match)[names],
        issue=lookup(trace.names, COLLECTIVE_ISSUE_RE.match)[names],
        step=step, main_thread=main)


def inherit(flag: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """``flag`` or any ancestor's, per position (level by level, no per-event loop)."""
    out = flag.copy()
    if not len(out):
        return out
    order = stable_order(depth)
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
    for d in range(1, len(bounds) - 1):
        members = order[bounds[d]:bounds[d + 1]]
        up = parent[members]
        ok = up >= 0
        out[members[ok]] |= out[up[ok]]
    return out


def _boundaries(trace: Trace, cpu: CpuEvents) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every boundary (node, time, owner of the interval after it) in chain order: by thread, time,
    ends before starts (zero-length events' ends after the starts), outer starts first, inner
    ends first.  Nodes, owners and threads are :data:`~.edges.INDEX`."""
    n = len(cpu)
    ts = trace.ts[cpu.events]
    end = ts + np.maximum(trace.dur[cpu.events], 0.0)
    kinds = np.concatenate([np.ones(n, np.int8), np.where(end <= ts, 2, 0).astype(np.int8)])
    times = np.concatenate([ts, end])
    order = np.lexsort((np.concatenate([-end, -ts]), kinds, times,
                        np.concatenate([cpu.thread, cpu.thread]))).astype(INDEX)
    del ts, end, kinds
    is_start = order < n
    pos = np.where(is_start, order, order - n)  # the event's position
    nodes = np.where(is_start, cpu.start_node[pos], cpu.end_node[pos])
    owner = np.where(is_start, pos, cpu.parent[pos])
    return nodes, times[order], np.stack([owner, cpu.thread[pos]])


def cpu_edges(trace: Trace, cpu: CpuEvents, edges: EdgeList) -> dict[int, int]:
    """Add every CPU chain edge, and the ISSUE, WAIT and WAKE edges between threads.

    Args:
        trace: the rank's trace.
        cpu: its CPU events (``blocking`` complete).
        edges: where the edges go.

    Returns:
        Run position -> the node where the thread that waited for it resumed, for the collectives
        whose result came before gloo's span ended (the last rank to arrive gets it while its span
        still sends to the others): that is when the collective completed for the rank.
    """
    if not len(cpu):
        return {}
    nodes, times, (owner, thread) = _boundaries(trace, cpu)
    same = thread[1:] == thread[:-1]
    src, dst = nodes[:-1][same], nodes[1:][same]
    t0, t1, own = times[:-1][same], times[1:][same], owner[:-1][same]
    on_thread = thread[:-1][same]
    del same, owner
    loader = inherit(cpu.loader, cpu.parent, cpu.depth)
    blocking = inherit(cpu.blocking, cpu.parent, cpu.depth)
    in_run = inherit(cpu.run, cpu.parent, cpu.depth)
    has = own >= 0
    o = np.maximum(own, 0)
    category = np.full(len(src), cat.CPU_ONLY, dtype=np.int8)
    category[has & cpu.launch[o]] = cat.LAUNCH
    category[has & in_run[o]] = cat.COMMUNICATION
    category[has & loader[o]] = cat.DATA_LOADER
    category[has & (blocking[o] | cpu.polling[o])] = cat.HOST_SYNC
    weight = t1 - t0
    idle = (~has | cpu.step[o]) & (on_thread != cpu.main_thread)
    weight[idle | (has & blocking[o])] = 0.0
    bursts = _bursts(trace, cpu)
    issuers = _issuers(trace, cpu)
    waiting = lookup(trace.names, COLLECTIVE_WAIT_RE.search)[trace.name_id[cpu.events]]
    gaps = _gaps(trace, cpu, own, has & (loader[o] | blocking[o] | in_run[o]), waiting)
    top_level = np.zeros(len(src), dtype=bool)
    removable = _removable_waits(trace, cpu, issuers)
    early: dict[int, int] = {}
    # quiet, then a new event (entering a collective's wait is not the thread resuming from one)
    started = dst - cpu.start_node[0]  # the event whose start a chain interval ends at, if any
    enters = (started >= 0) & (started < len(cpu))
    enters[enters] = ~waiting[started[enters]]
    resumes = gaps & enters & (t1 - t0 >= MIN_QUIET_US)
    del started, enters
    waits: list[tuple[int, int, int, bool]] = []  # (chain interval, source node, owner, removable)
    in_wait = has & waiting[o]  # the thread inside a collective's wait: it waits, however long
    found = _waits(trace, cpu, bursts, issuers, (t0, t1, on_thread, gaps), in_wait)
    waited_in_op = {int(bursts.first[burst]) for interval, burst in found if in_wait[interval]}
    for interval, run in _early_resumes(trace, cpu, issuers, (t0, t1, on_thread, resumes)):
        if run in waited_in_op:  # it was awaited in a wait operator: the thread went on meanwhile
            continue
        early[run] = int(dst[interval])
        waits.append((interval, int(cpu.start_node[run]), int(cpu.events[run]), run in removable))
    for interval, burst in found:
        first = int(bursts.first[burst])
        if first in early:  # its waiter resumed before gloo's span ended: that is its wait
            continue
        waits.append((interval, int(bursts.end_node[burst]), int(cpu.events[first]), first in removable))
    if waits:  # each wait's chain interval carries no work: a WAIT edge from what it waited for
        at, wait_src, owner_of, flag = (np.array(col) for col in zip(*waits, strict=True))
        weight[at] = 0.0
        np.logical_or.at(top_level, at, flag)  # an interval may be named twice
        edges.add(wait_src, dst[at], 0.0, WAIT, cat.CPU_ONLY, owner_of, flag)
    del t0, t1, on_thread, gaps, resumes, in_wait  # what the waits were found from
    edges.add(src, dst, weight, CHAIN, category, np.where(has, cpu.events[o], -1), top_level)
    _issue_edges(cpu, issuers, edges)
    _wake_edges(cpu, bursts, issuers, nodes, times, thread, edges)
    return early


def _removable_waits(trace: Trace, cpu: CpuEvents, issuers: dict[int, int]) -> set[int]:
    """The runs whose wait a step could leave out (``host_sync``'s CPU form): all-reduces the step
    issued at its top level, when few enough to be metrics (:func:`~..analyzers.collectives.are_metrics`).
    More a step, or broadcasts, are the model's own communication (Megatron's tensor-parallel
    all-reduces): their result is needed where the step waits for it."""
    top = [run for run, issuer in issuers.items()
           if (cpu.parent[issuer] < 0 or bool(cpu.step[cpu.parent[issuer]]))
           and canonical_kind(trace.names[trace.name_id[cpu.events[run]]]) == "all_reduce"]
    return set(top) if are_metrics(len(top), int(cpu.step.sum())) else set()


def _early_resumes(trace: Trace, cpu: CpuEvents, issuers: dict[int, int],
                   intervals: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> list[tuple[int, int]]:
    """(chain interval, run) of each gap of a thread that issued a collective, went quiet as gloo
    began running it and resumed while gloo's span still ran: the collective's result was ready.

    Chain intervals are grouped by thread, in time order there (``t0``, ``t1`` sorted), so a run's
    candidates (begun after the issue, at most :data:`RESUME_US` after gloo began, ended after it
    began) are a range found by binary search, a thread at a time: a handful per run, never all of
    the thread's; all runs' candidates are then tested together (:func:`~.ranges.range_pairs`).
    """
    t0, t1, thread, gap = intervals
    if not issuers or not len(t0):
        return []
    runs = np.fromiter(issuers, dtype=np.int64, count=len(issuers))
    by = np.fromiter(issuers.values(), dtype=np.int64, count=len(issuers))
    start = trace.ts[cpu.events[runs]]
    end = start + trace.dur[cpu.events[runs]]
    since = trace.ts[cpu.events[by]]
    th = cpu.thread[by]
    first = np.zeros(len(runs), dtype=np.int64)
    last = np.zeros(len(runs), dtype=np.int64)
    for one in np.unique(th).tolist():
        sel = np.flatnonzero(th == one)
        a, b = int(np.searchsorted(thread, one, side="left")), int(np.searchsorted(thread, one, side="right"))
        first[sel] = a + np.maximum(np.searchsorted(t0[a:b], since[sel], side="left"),
                                    np.searchsorted(t1[a:b], start[sel], side="right"))
        last[sel] = a + np.searchsorted(t0[a:b], start[sel] + RESUME_US, side="right")
    out: list[tuple[int, int]] = []
    for k, i in range_pairs(first, last):
        u0, u1 = t0[i], t1[i]
        ok = gap[i] & (u1 < end[k]) & (u1 - start[k] >= 0.5 * (u1 - u0))
        k, i = k[ok], i[ok]
        lead = first_of_each(k)
        out += zip(i[lead].tolist(), runs[k[lead]].tolist(), strict=True)
    return out


def _issuers(trace: Trace, cpu: CpuEvents) -> dict[int, int]:
    """Run span position -> the position of the c10d operator that issued it: per process and
    collective type, the earliest issue not yet taken that started before the run (gloo runs a
    process group's collectives in order: :func:`~..analyzers.collectives.match_issues`)."""
    ts = trace.ts[cpu.events]
    pid = [trace.threads[int(t)][0] for t in range(len(trace.threads))]
    runs = np.flatnonzero(cpu.run).tolist()
    issues = np.flatnonzero(cpu.issue).tolist()
    if not runs or not issues:
        return {}

    def name(k: int) -> str:
        return trace.names[trace.name_id[cpu.events[k]]]

    backend = backend_of([name(r) for r in runs])
    found = match_issues([((pid[cpu.thread[k]], run_kind(name(k), backend)), float(ts[k])) for k in issues],
                         [((pid[cpu.thread[r]], canonical_kind(name(r))), float(ts[r])) for r in runs])
    return {runs[r]: issues[k] for r, k in found.items()}


def _issue_edges(cpu: CpuEvents, issuers: dict[int, int], edges: EdgeList) -> None:
    if issuers:
        runs = np.array(list(issuers), dtype=np.int64)
        by = np.array(list(issuers.values()), dtype=np.int64)
        edges.add(cpu.start_node[by], cpu.start_node[runs], 0.0, ISSUE, cat.COMMUNICATION, cpu.events[runs])


@dataclass
class Bursts:
    """Activity on the threads that run no step: runs of top-level events less than
    :data:`BURST_GAP_US` apart (each collective gloo runs is one of its own).  Per burst: its first
    event's position, start time, end and end node."""

    first: np.ndarray
    start: np.ndarray
    end: np.ndarray
    end_node: np.ndarray
    thread: np.ndarray
    #: whether it starts with an operator or annotation, not a runtime call (a watchdog polling).
    work: np.ndarray


def _bursts(trace: Trace, cpu: CpuEvents) -> Bursts:
    top = np.flatnonzero((cpu.depth == 0) & (cpu.thread != cpu.main_thread))
    if not len(top):
        none = np.zeros(0, dtype=np.int64)
        return Bursts(none, np.zeros(0), np.zeros(0), none, none, np.zeros(0, dtype=bool))
    top = top[np.lexsort((trace.ts[cpu.events[top]], cpu.thread[top]))]
    ts = trace.ts[cpu.events[top]]
    end = ts + np.maximum(trace.dur[cpu.events[top]], 0.0)
    thread = cpu.thread[top]
    reach = end.copy()  # the latest end so far on the event's thread
    for th in np.unique(thread).tolist():
        sel = np.flatnonzero(thread == th)
        reach[sel] = np.maximum.accumulate(end[sel])
    new = np.ones(len(top), dtype=bool)
    new[1:] = (thread[1:] != thread[:-1]) | (ts[1:] - reach[:-1] > BURST_GAP_US) | cpu.run[top[1:]]
    starts = np.flatnonzero(new)
    stops = np.r_[starts[1:], len(top)].astype(np.int64) - 1
    last = np.array([lo + int(np.argmax(end[lo:hi + 1])) for lo, hi in zip(starts, stops, strict=True)],
                    dtype=np.int64)
    runtime = lookup(trace.cats, ("cuda_runtime", "cuda_driver"))[trace.cat_id[cpu.events[top[starts]]]]
    return Bursts(first=top[starts], start=ts[starts], end=reach[stops],
                  end_node=cpu.end_node[top[last]] if len(last) else np.zeros(0, np.int64),
                  thread=thread[starts], work=~runtime)


def _gaps(trace: Trace, cpu: CpuEvents, own: np.ndarray, busy: np.ndarray, waiting: np.ndarray) -> np.ndarray:
    """Per chain interval, whether the thread may be waiting in it: inside no operator, in an
    annotation, between an operator's children or in a functional collective's wait (``waiting``, per
    event); not in the loader, a blocking call or a run."""
    children = np.bincount(cpu.parent[cpu.parent >= 0], minlength=len(cpu))
    o = np.maximum(own, 0)
    annotation = lookup(trace.cats, ("user_annotation",))[trace.cat_id[cpu.events]]
    return ((own < 0) | annotation[o] | (children[o] > 0) | waiting[o]) & ~busy


def _waits(trace: Trace, cpu: CpuEvents, bursts: Bursts, issuers: dict[int, int],
           intervals: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
           in_wait: np.ndarray) -> list[tuple[int, int]]:
    """(chain interval, burst) of each gap that waited for a burst on another thread of its process
    (a collective gloo ran, the backward pass the autograd thread ran): the gap began after the
    burst did (or its collective was issued) and ends right after the burst ended; a gap inside a
    collective's wait operator (``in_wait``) waited for an issued collective that ended in it,
    however late the thread was woken on a busy host."""
    t0, t1, thread, gap = intervals
    if not len(bursts.first) or not len(t0):
        return []
    pid_of = np.array([trace.threads[int(t)][0] for t in range(len(trace.threads))], dtype=object)
    firsts = np.flatnonzero(np.r_[True, thread[1:] != thread[:-1]])  # intervals are grouped by thread
    bounds = zip(firsts.tolist(), [*firsts[1:].tolist(), len(thread)], strict=True)
    issuer = np.array([issuers.get(int(f), -1) for f in bursts.first.tolist()], dtype=np.int64)
    issued = issuer >= 0
    issued_at = trace.ts[cpu.events[np.maximum(issuer, 0)]]
    found: list[tuple[np.ndarray, np.ndarray]] = []  # per thread: (burst, interval) of its waits
    for th, (lo, hi) in zip(thread[firsts].tolist(), bounds, strict=True):
        b = np.flatnonzero((bursts.thread != th) & (pid_of[bursts.thread] == pid_of[th]))
        end = bursts.end[b]
        i = lo + np.searchsorted(t0[lo:hi], end, side="right") - 1
        valid = i >= lo
        b, i, end = b[valid], i[valid], end[valid]
        fits = gap[i] & (t1[i] >= end)
        b, i, end = b[fits], i[fits], end[fits]
        u0, u1, by_issue = t0[i], t1[i], issued[b]
        # a thread that issued the collective and then went quiet was waiting for it, however
        # slowly it was woken on a busy host; for other work the evidence is the timing alone
        slack = np.maximum(RESUME_US, np.where(by_issue, ISSUED_RESUME_SHARE, 0.1) * (u1 - u0))
        slack = np.where(in_wait[i] & by_issue, u1 - u0, slack)  # in a wait operator: until it returns
        # an issued collective ran after it was issued; other work was woken about when the gap began
        began = bursts.start[b]
        since = np.where(by_issue, issued_at[b], began - slack)
        # work another thread did for this one began as it went quiet and fills most of its gap
        covers = by_issue | (bursts.work[b] & (u1 - u0 >= MIN_QUIET_US) & (u0 <= began + RESUME_US)
                             & (end - np.maximum(began, u0) >= 0.5 * (u1 - u0)))
        ok = (u0 >= since) & (u1 - end <= slack) & covers
        found.append((b[ok], i[ok]))
    if not found:
        return []
    burst = np.concatenate([b for b, _ in found])
    interval = np.concatenate([i for _, i in found])
    order = np.argsort(burst, kind="stable")  # by burst, then the threads' order
    return list(zip(interval[order].tolist(), burst[order].tolist(), strict=True))


def _wake_edges(cpu: CpuEvents, bursts: Bursts, issuers: dict[int, int], nodes: np.ndarray,
                times: np.ndarray, thread: np.ndarray, edges: EdgeList) -> None:
    """A burst that no issued collective explains starts after the step's thread's latest boundary
    before it (what woke it: ``loss.backward()`` for the autograd thread)."""
    main = np.flatnonzero(thread == cpu.main_thread)
    if not len(main):
        return
    m_times, m_nodes = times[main], nodes[main]
    src, dst, owner = [], [], []
    for b in range(len(bursts.first)):
        first = int(bursts.first[b])
        if first in issuers or not bursts.work[b]:
            continue
        j = int(np.searchsorted(m_times, bursts.start[b], side="right")) - 1
        if j >= 0:
            src.append(m_nodes[j])
            dst.append(cpu.start_node[first])
            owner.append(cpu.events[first])
    edges.add(np.array(src, np.int64), np.array(dst, np.int64), 0.0, WAKE, cat.CPU_ONLY,
              np.array(owner, np.int64))
