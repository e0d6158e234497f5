"""FSDP2's phases: where a ``fully_shard`` model's step goes, in FSDP2's own terms.

FSDP2 (``torch.distributed.fsdp.fully_shard``) records a ``user_annotation`` around each phase of
each sharded module: ``FSDP::pre_forward (blocks.3)`` (unshard: it waits for the parameters'
all-gather), ``FSDP::all_gather (blocks.3)``, ``FSDP::post_backward_reduce (blocks.0)`` (the
gradients' reduce-scatter), ``FSDP::backward_prefetch for blocks.2``, ``FSDP::root_post_backward_callback``
(the end of backward, which waits for the last reduce-scatter)...  Summed per phase and divided by
the trace's steps, they say how much of a step unsharding, resharding and reducing take, and on
which modules; the phases nest (``pre_forward`` holds its module's ``all_gather`` when nothing was
prefetched), so their times are not added up.
"""

from __future__ import annotations

import re
from collections import defaultdict

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.trace import Trace

__all__ = ["FSDP_PHASES", "FsdpPhase", "fsdp_phases", "is_fsdp2"]

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
