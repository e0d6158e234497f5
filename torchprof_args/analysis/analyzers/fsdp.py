"""FSDP2's phases: where a ``fully_shard`` model's step goes, in FSDP2's own terms.

FSDP2 (``torch.distributed.fsdp.fully_shard``) records a ``user_annotation`` around each phase of
each sharded module: ``FSDP::pre_forward (blocks.3)`` (unshard: it waits for the parameters'
all-gather), ``FSDP::all_gather (blocks.3)``, ``FSDP::post_backward_reduce (blocks.0)`` (the
gradients' reduce-scatter), ``FSDP::backward_prefetch for blocks.2``, ``FSDP::root_post_backward_callback``
(the end of backward, which waits for the last reduce-scatter)...  Summed per phase and divided by
the trace's steps, they say how much of a step unsharding, resharding and reducing take, and on
which modules; the phases nest (``pre_forward`` holds its module's ``all_gather`` when nothing was
prefetched), so their times are not added up.

Added up, they are :data:`FSDP2_STEP_PHASES`: every moment of a step is in the phase of the innermost
annotation open then (on any of the rank's threads; outside every one, ``outside_fsdp``), so the
phases' times sum to the step's (:func:`fsdp_step_split`); the critical path puts each of its edges in
one the same way (:mod:`~..critical_path.fsdp_edges`).
"""

from __future__ import annotations

import re
from collections import defaultdict

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.cpu_ops import cpu_tree
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.intervals import covered, merge_intervals, subtract
from torchprof_args.analysis.trace import Trace

__all__ = ["FSDP2_STEP_PHASES", "FSDP_PHASES", "OUTSIDE_FSDP", "FsdpPhase", "FsdpStepSplit",
           "annotation_phases", "fsdp_phases", "fsdp_step_split", "innermost_phase", "is_fsdp2"]

#: each phase FSDP2 annotates, in the order of a step, and what it is.
FSDP_PHASES: dict[str, str] = {
    "root_pre_forward": "the root module's start of forward (lazy init, streams)",
    "pre_forward": "unshard before forward: waits for the module's all-gather unless prefetched",
    "all_gather": "the parameters' all-gather (unshard)",
    "all_gather_copy_out": "the gathered parameters copied out of the all-gather buffer",
    "post_forward": "reshard after forward (reshard_after_forward)",
    "pre_backward": "unshard before backward: waits for the all-gather unless prefetched",
    "backward_prefetch": "the next module's all-gather issued early in backward",
    "post_backward_accumulate": "gradients accumulated into the unsharded ones",
    "post_backward_reshard": "reshard after backward",
    "post_backward_reduce": "the gradients' reduce-scatter (and all-reduce under HSDP)",
    "post_backward_rs_wait": "wait for the previous module's reduce-scatter",
    "root_post_backward_callback": "the end of backward: waits for the last reduce-scatter",
}

#: FSDP2's phases of a step, additive (a moment, or a critical-path edge, is in the phase of the
#: innermost annotation open there), in output order, and what each holds.
FSDP2_STEP_PHASES: dict[str, str] = {
    "unshard": "all-gathers and their waits (pre_forward, pre_backward, all_gather, prefetches)",
    "reshard": "parameters freed (post_forward, post_backward_reshard)",
    "reduce_scatter": "reduce-scatters and their waits (post_backward_reduce, rs_wait, root callback)",
    "other_fsdp": "FSDP2's other annotations (post_backward_accumulate, casts)",
    "outside_fsdp": "outside FSDP2's annotations: the model's compute, the optimizer, the loader",
}
_STEP_PHASE_OF = {
    **dict.fromkeys(("root_pre_forward", "pre_forward", "pre_backward", "all_gather", "all_gather_copy_out",
                     "forward_prefetch", "backward_prefetch"), "unshard"),
    **dict.fromkeys(("post_forward", "post_backward_reshard"), "reshard"),
    **dict.fromkeys(("post_backward_reduce", "post_backward_rs_wait", "root_post_backward_callback"),
                    "reduce_scatter"),
}
#: the code of ``outside_fsdp`` (the phases' codes are their positions in :data:`FSDP2_STEP_PHASES`).
OUTSIDE_FSDP = list(FSDP2_STEP_PHASES).index("outside_fsdp")
_ANNOTATION = re.compile(r"^FSDP::(\w+)(?: \((.+)\)| for (.+))?$")
#: modules listed per phase, the most time first.
_MODULES_KEPT = 5


class FsdpPhase(msgspec.Struct, frozen=True, gc=False):
    """One FSDP2 phase of the trace: how often it ran, its time per step, and the modules it ran for
    (the most time first; empty for the root's phases)."""

    phase: str
    calls: int
    ms_per_step: float
    modules: list[str]


def is_fsdp2(trace: Trace) -> bool:
    """Whether ``trace``'s model is ``fully_shard``-ed: it has FSDP2's annotations (a scan of the
    trace's distinct names only, cheap enough for every diagnose kind and every rank)."""
    return any(name.startswith("FSDP::") and _ANNOTATION.match(name) for name in trace.names)


def fsdp_phases(trace: Trace) -> list[FsdpPhase]:
    """FSDP2's phases in ``trace``, in a step's order (empty when the model is not ``fully_shard``-ed).

    Args:
        trace: a loaded trace.

    Returns:
        One :class:`FsdpPhase` per phase the trace recorded; the time per step is the phase's total
        over the trace's ``ProfilerStep``s (the whole trace when it has none).
    """
    wanted = {i: m for i, name in enumerate(trace.names) if (m := _ANNOTATION.match(name))}
    if not wanted:
        return []
    ids = np.fromiter(wanted, dtype=np.int64)
    rows = np.flatnonzero(np.isin(trace.name_id, ids))
    if not len(rows):
        return []
    n_steps = max(len(steps(trace)), 1)
    time: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    by_module: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for name_id, dur in zip(trace.name_id[rows].tolist(), trace.dur[rows].tolist(), strict=True):
        match = wanted[name_id]
        phase, module = match.group(1), match.group(2) or match.group(3)
        time[phase] += dur
        calls[phase] += 1
        if module:
            by_module[phase][module] += dur
    order = {phase: i for i, phase in enumerate(FSDP_PHASES)}
    return [FsdpPhase(phase, calls[phase], time[phase] / 1e3 / n_steps,
                      [m for m, _ in sorted(by_module[phase].items(), key=lambda kv: -kv[1])[:_MODULES_KEPT]])
            for phase in sorted(time, key=lambda p: (order.get(p, len(order)), p))]


class FsdpStepSplit(msgspec.Struct, frozen=True, gc=False):
    """A rank's mean step by FSDP2 phase (:data:`FSDP2_STEP_PHASES`, ms): the phases sum to ``step_ms``."""

    step_ms: float
    by_phase: dict[str, float]


def annotation_phases(trace: Trace) -> np.ndarray:
    """Per name of ``trace``, the code of the FSDP2 phase its annotation is in (-1: not FSDP2's)."""
    codes = {name: i for i, name in enumerate(FSDP2_STEP_PHASES)}
    other = codes["other_fsdp"]
    out = np.full(len(trace.names), -1, dtype=np.int8)
    for i, name in enumerate(trace.names):
        if name.startswith("FSDP::") and (m := _ANNOTATION.match(name)):
            out[i] = codes.get(_STEP_PHASE_OF.get(m.group(1), ""), other)
    return out


def innermost_phase(own: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Per CPU event (:func:`~.cpu_ops.cpu_tree`'s positions), the phase of the innermost FSDP2
    annotation around it or its own (``own``: each event's, -1 for none); -1 where there is none."""
    out = own.copy()
    if not len(out):
        return out
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
    for d in range(1, len(bounds) - 1):  # level by level: a parent is done before its children
        members = order[bounds[d]:bounds[d + 1]]
        up = parent[members]
        take = (out[members] < 0) & (up >= 0)
        out[members[take]] = out[up[take]]
    return out


def _innermost_segments(trace: Trace, phase_of_name: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every stretch of a thread inside an FSDP2 annotation: start, end and the phase of the innermost
    annotation open then (us)."""
    tree = cpu_tree(trace)
    events = tree["idx"].astype(np.int64)
    own = phase_of_name[trace.name_id[events]].astype(np.int64)
    mine = np.flatnonzero(own >= 0)
    # each annotation's closest annotation around it (its FSDP2 parent)
    nearest = innermost_phase(np.where(own >= 0, np.arange(len(events)), -1), tree["parent"].astype(np.int64),
                              tree["depth"].astype(np.int64))
    up = tree["parent"][mine].astype(np.int64)
    fsdp_parent = np.where(up >= 0, nearest[np.maximum(up, 0)], -1)
    rows = events[mine]
    ts = trace.ts[rows]
    end = ts + np.maximum(trace.dur[rows], 0.0)
    # boundaries by thread and time, ends before starts, outer starts first, inner ends first: the
    # stretch after a start is its annotation's, after an end its parent's
    times = np.concatenate([ts, end])
    kinds = np.r_[np.ones(len(ts), np.int8), np.zeros(len(ts), np.int8)]
    thread = np.tile(trace.thread_id[rows].astype(np.int64), 2)
    order = np.lexsort((np.concatenate([-end, -ts]), kinds, times, thread))
    owner_pos = np.concatenate([mine, fsdp_parent])[order]
    t, th = times[order], thread[order]
    same = (th[1:] == th[:-1]) & (owner_pos[:-1] >= 0) & (t[1:] > t[:-1])
    return t[:-1][same], t[1:][same], own[owner_pos[:-1][same]]


def fsdp_step_split(trace: Trace) -> FsdpStepSplit | None:
    """The rank's mean step by FSDP2 phase (None: the model is not ``fully_shard``-ed, or no steps).

    A moment of a step is in the phase of the innermost FSDP2 annotation open then; where threads
    are in different phases at once (the autograd thread's reduce-scatter beside the main thread's
    wait), the first of :data:`FSDP2_STEP_PHASES` wins; outside every annotation it is ``outside_fsdp``.

    Args:
        trace: a loaded trace.

    Returns:
        The :class:`FsdpStepSplit` over the trace's ``ProfilerStep``\\ s.
    """
    phase_of_name = annotation_phases(trace)
    step_list = steps(trace)
    if not step_list or not (phase_of_name >= 0).any():
        return None
    start = np.array([s["start_us"] for s in step_list])
    stop = start + np.array([s["dur_us"] for s in step_list])
    lo, hi, phase = _innermost_segments(trace, phase_of_name)
    taken = merge_intervals(np.zeros(0), np.zeros(0))
    by_phase: dict[str, float] = {}
    for code, name in enumerate(FSDP2_STEP_PHASES):
        if code == OUTSIDE_FSDP:
            continue
        mine = subtract(merge_intervals(lo[phase == code], hi[phase == code]), taken)
        by_phase[name] = float(covered(mine, start, stop).sum())
        taken = merge_intervals(np.r_[taken[0], mine[0]], np.r_[taken[1], mine[1]])
    n = len(step_list)
    step_us = float((stop - start).sum())
    by_phase["outside_fsdp"] = step_us - sum(by_phase.values())
    return FsdpStepSplit(round(step_us / n / 1e3, 4),
                         {k: round(v / n / 1e3, 4) for k, v in by_phase.items()})
