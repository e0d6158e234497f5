"""What-ifs on one rank's graph: the graph with one cause of lost time removed.

Each cause is named like the ``diagnose`` kind that reports it, and says which edges lose their
weight or are cut (a dependency that no longer holds); a replay (:mod:`.propagate`) of the changed
graph gives the rank's timing without the cause, everything else as it was:

* ``dataloader_stall``: the data loader's fetches take no time;
* ``host_sync``: blocking host calls no longer wait for the device, and a step no longer waits
  right away for a collective it issued at its top level (a CPU job's ``work.wait()`` on a metric:
  the remedy reduces it where it is needed, e.g. at the logging interval, so gloo's worker no
  longer runs it in the step either);
* ``exposed_comm``: nothing waits for communication (host waits, streams waiting on NCCL kernels):
  it runs as fully overlapped as the schedule allows, still taking its time on its own stream;
* ``launch_bound``: the launch calls take no host time and kernels the GPU waited to see launched
  start as soon as their stream allows (CUDA graphs), except those launched by the data loader;
* ``gpu_idle``: the same, and the gaps between kernels closed;
* ``memcpy``: host/device copies hidden behind compute (they take no time on the path).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from torchprof_args.analysis.critical_path import categories as cat
from torchprof_args.analysis.critical_path.cpu_graph import inherit
from torchprof_args.analysis.critical_path.edges import CHAIN, INFER, KERNEL, LAUNCH_EDGE, STREAM, SYNC, WAIT
from torchprof_args.analysis.critical_path.graph import LocalGraph

__all__ = ["CAUSES", "Change", "cause_change", "faster_change"]

#: (weights, cut): a replay's edge weights and the edges it leaves out; None: nothing to change.
Change = tuple[np.ndarray, np.ndarray]


def _no_loader(graph: LocalGraph) -> Change | None:
    hit = graph.category == cat.DATA_LOADER
    if not hit.any():
        return None
    weight = graph.weight.copy()
    weight[hit] = 0.0
    return weight, np.zeros(len(weight), dtype=bool)


def _no_host_sync(graph: LocalGraph) -> Change | None:
    waits = (graph.kind == WAIT) & graph.flag  # a step waiting at once for a collective it issued
    cut = (graph.kind == SYNC) | waits | _after_waited_runs(graph, waits)
    blocked = (graph.category == cat.HOST_SYNC) & (graph.kind == CHAIN)
    if not (cut.any() or blocked.any()):
        return None
    weight = graph.weight.copy()
    weight[blocked] = 0.0
    return weight, cut


def _after_waited_runs(graph: LocalGraph, waits: np.ndarray) -> np.ndarray:
    """The edges out of the end of the collectives ``waits`` waited for: gloo's worker moves on
    without them (a metric reduced where it is needed, e.g. at the logging interval, is no longer
    in the step)."""
    position = np.full(len(graph.trace.ts) + 1, -1, dtype=np.int64)
    position[graph.cpu.events] = np.arange(len(graph.cpu), dtype=np.int64)
    runs = position[graph.owner[waits]]
    ends = np.zeros(len(graph.t), dtype=bool)
    ends[graph.cpu.end_node[runs[runs >= 0]]] = True
    return ends[graph.src] & (graph.kind == CHAIN)


def _comm_end(graph: LocalGraph) -> np.ndarray:
    """Per edge, whether its source is the end of a communication kernel."""
    k = graph.kernels
    comm_end = np.zeros(len(graph.t), dtype=bool)
    comm_end[k.end_node[k.category == cat.COMMUNICATION]] = True
    return comm_end[graph.src]


def _overlapped(graph: LocalGraph) -> Change | None:
    run_event = np.zeros(len(graph.trace.ts) + 1, dtype=bool)
    run_event[graph.cpu.events[graph.cpu.run]] = True
    on_comm = (graph.kind == WAIT) & run_event[graph.owner]  # a host waiting for gloo (owner: gloo's span)
    cut = on_comm | (np.isin(graph.kind, (SYNC, INFER)) & _comm_end(graph))
    if not cut.any():
        return None
    return graph.weight.copy(), cut


def _launch_waits(graph: LocalGraph) -> np.ndarray:
    """The launch edges that bind their kernel, but not those of launches inside the data loader."""
    binds = np.zeros(len(graph.src), dtype=bool)
    binds[graph.binding[graph.binding >= 0]] = True
    cpu = graph.cpu
    loader = inherit(cpu.loader, cpu.parent, cpu.depth)
    k = graph.kernels
    by_loader = np.zeros(len(graph.t), dtype=bool)
    by_loader[k.start_node[(k.launch >= 0) & loader[np.maximum(k.launch, 0)]]] = True
    return (graph.kind == LAUNCH_EDGE) & binds & ~by_loader[graph.dst]


def _launch_gaps_closed(graph: LocalGraph) -> Change | None:
    cut = _launch_waits(graph)
    calls = (graph.kind == CHAIN) & (graph.category == cat.LAUNCH)
    if not (cut.any() or calls.any()):
        return None
    weight = graph.weight.copy()
    weight[calls] = 0.0  # the launch calls' own time on the host (one graph launch replaces them)
    return weight, cut


def _gpu_kept_busy(graph: LocalGraph) -> Change | None:
    cut = _launch_waits(graph)
    gaps = np.isin(graph.kind, (STREAM, INFER))
    if not (cut.any() or gaps.any()):
        return None
    weight = graph.weight.copy()
    weight[gaps] = graph.nominal[gaps]
    return weight, cut


def _copies_hidden(graph: LocalGraph) -> Change | None:
    hit = (graph.kind == KERNEL) & (graph.category == cat.MEMCPY)
    if not hit.any():
        return None
    weight = graph.weight.copy()
    weight[hit] = 0.0
    return weight, np.zeros(len(weight), dtype=bool)


#: every cause, by the diagnose kind that reports it.
CAUSES: dict[str, Callable[[LocalGraph], Change | None]] = {
    "dataloader_stall": _no_loader,
    "host_sync": _no_host_sync,
    "exposed_comm": _overlapped,
    "launch_bound": _launch_gaps_closed,
    "gpu_idle": _gpu_kept_busy,
    "memcpy": _copies_hidden,
}


def cause_change(graph: LocalGraph, cause: str) -> Change | None:
    """The change removing ``cause`` (a key of :data:`CAUSES`); None when the rank has none of it."""
    return CAUSES[cause](graph)


def faster_change(graph: LocalGraph, pattern: re.Pattern[str], factor: float) -> Change | None:
    """Kernels and CPU operators whose name matches ``pattern`` ``factor`` times faster (their own
    time on their thread or stream divided by it)."""
    names = graph.trace.names
    match = np.array([bool(pattern.search(n)) for n in names] + [False], dtype=bool)
    owner = graph.owner
    hit = (owner >= 0) & np.isin(graph.kind, (KERNEL, CHAIN))
    hit[hit] = match[graph.trace.name_id[owner[hit]]]
    if not hit.any():
        return None
    weight = graph.weight.copy()
    weight[hit] = weight[hit] / factor
    return weight, np.zeros(len(weight), dtype=bool)
