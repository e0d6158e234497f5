"""FSDP2's phases on a rank's graph: each edge's time in the phase of the innermost ``FSDP::``
annotation around what it is attributed to (:data:`~..analyzers.fsdp.FSDP2_STEP_PHASES`).

A CPU event is in the phase of the innermost annotation around it on its thread; a collective gloo
runs on its own thread is in the phase of the c10d operator that issued it (its ``ISSUE`` edge), a
kernel in that of the call that launched it; everything else is ``outside_fsdp``.  So a path's time
by phase sums to its time by category.
"""

from __future__ import annotations

import numpy as np

from torchprof_args.analysis.analyzers.fsdp import OUTSIDE_FSDP, annotation_phases, innermost_phase, is_fsdp2
from torchprof_args.analysis.critical_path.edges import ISSUE
from torchprof_args.analysis.critical_path.graph import LocalGraph

__all__ = ["fsdp_tags"]


def _event_phases(graph: LocalGraph) -> np.ndarray:
    """Per trace event, its phase code (:data:`OUTSIDE_FSDP` for none)."""
    trace, cpu = graph.trace, graph.cpu
    own = annotation_phases(trace)[trace.name_id[cpu.events]].astype(np.int64)
    first = innermost_phase(own, cpu.parent, cpu.depth)
    position = np.full(len(trace.ts), -1, dtype=np.int64)
    position[cpu.events] = np.arange(len(cpu))
    issue = graph.kind == ISSUE  # gloo's span takes the phase of the operator that issued it
    runs = position[graph.event[graph.dst[issue]]]
    issuers = position[graph.event[graph.src[issue]]]
    ok = (runs >= 0) & (issuers >= 0)
    runs, issuers = runs[ok], issuers[ok]
    seed = own.copy()
    unset = seed[runs] < 0
    seed[runs[unset]] = first[issuers[unset]]
    phase = np.full(len(trace.ts), OUTSIDE_FSDP, dtype=np.int64)
    inside = innermost_phase(seed, cpu.parent, cpu.depth)
    phase[cpu.events] = np.where(inside >= 0, inside, OUTSIDE_FSDP)
    kernels = graph.kernels
    launched = np.flatnonzero(kernels.launch >= 0)  # a kernel takes its launch's
    phase[kernels.events[launched]] = phase[cpu.events[kernels.launch[launched]]]
    return phase


def fsdp_tags(graph: LocalGraph) -> tuple[np.ndarray, list[int]] | None:
    """Per edge of ``graph`` and per collective record (its arrival's event), the code of its FSDP2
    phase (None: the trace is not FSDP2's)."""
    if not is_fsdp2(graph.trace):
        return None
    phase = _event_phases(graph)
    owner = graph.owner
    records = [int(phase[graph.event[a]]) if a >= 0 and graph.event[a] >= 0 else OUTSIDE_FSDP
               for a in graph.arrival.tolist()]
    return np.where(owner >= 0, phase[np.maximum(owner, 0)], OUTSIDE_FSDP), records
