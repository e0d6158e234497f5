"""What fixing each finding saves, computed on the job's dependency graph (:mod:`..critical_path`).

A finding's per-rank bound (the loader's idle time, the worst rank's exposed communication...)
over-promises in a synchronous job: its ranks meet at every collective, so removing a problem on one
rank saves only what the path through the other ranks lets it save, and nothing where another rank
is slower anyway.  Here each finding's ``saving_ms_per_step`` becomes the step the cycle's graph
predicts with the finding's cause removed and everything else as it was (:data:`WHAT_IF`), minus
the step as measured, and never more than the bound (what the cause costs on its ranks: replaying
a straggler segment by segment against the median rank's segments can remove a little more than its
extra time per step); the bound stays as ``bound_ms_per_step``:

* a per-rank cause (``dataloader_stall``, ``host_sync``, ``exposed_comm``, ``launch_bound``,
  ``gpu_idle``, ``memcpy``): every rank's graph replayed without it (:mod:`..critical_path.variants`);
* ``straggler``: the slow ranks' time between collectives no longer than the median rank's;
* ``expert_imbalance``: every rank's expert work (the stretches into an MoE combine) at the ranks'
  mean (redistributed, not deleted: the light ranks take on what the heavy ones shed);
* ``collective_skew``: every rank's, beyond what the stragglers and the expert imbalance explain;
* ``pipeline_bubble`` and ``low_mfu`` keep their bound (the graph does not model a schedule with
  more micro-batches, nor faster kernels from higher arithmetic intensity): ``saving_basis``
  says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from torchprof_args.analysis.critical_path.cycle import CycleGraph, Scenario, mean_into, median_into
from torchprof_args.analysis.critical_path.variants import CAUSES
from torchprof_args.analysis.critical_path.whatif import WhatIf, scenario
from torchprof_args.analysis.diagnose.finding import Finding

__all__ = ["BASIS_BOUND", "BASIS_GRAPH", "on_the_graph"]

BASIS_GRAPH = "critical path"
BASIS_BOUND = "bound"


def _scenario(graph: CycleGraph, finding: Finding,
              found: Sequence[Finding]) -> tuple[Scenario, Scenario] | None:
    """(the replay with the finding's cause, the one it is compared with), None when the graph
    cannot answer for this kind."""
    if finding.kind in CAUSES:
        return Scenario(), scenario(graph, WhatIf(finding.kind, cause=finding.kind))
    if finding.kind == "straggler":
        return Scenario(), Scenario(into=median_into(graph, list(finding.ranks)))
    if finding.kind == "expert_imbalance":
        return Scenario(), Scenario(into=mean_into(graph))
    if finding.kind == "collective_skew":
        slow = next((f for f in found if f.kind == "straggler"), None)
        # the overloaded experts balanced on both sides (the rest of the ranks' work like the median after)
        moved = mean_into(graph) if any(f.kind == "expert_imbalance" for f in found) else {}
        base = Scenario(into={**moved, **(median_into(graph, list(slow.ranks)) if slow is not None else {})})
        return base, Scenario(into={**median_into(graph, graph.ranks), **moved})
    return None


def on_the_graph(findings: Sequence[Finding], graph: CycleGraph) -> list[Finding]:
    """``findings`` with their savings predicted by ``graph`` where it can (see the module).

    Args:
        findings: the job's findings (their savings the per-rank bounds).
        graph: the cycle's dependency graph.

    Returns:
        The findings, each with ``bound_ms_per_step`` (its bound) and ``saving_basis``.
    """
    measured = graph.step_ms(graph.replay())
    out = []
    for finding in findings:
        bound = finding.saving_ms_per_step
        pair = _scenario(graph, finding, findings) if measured is not None else None
        saving = None
        if pair is not None and measured is not None:
            base = measured if not pair[0].into else graph.step_ms(graph.replay(pair[0]))
            after = graph.step_ms(graph.replay(pair[1]))
            saving = None if base is None or after is None else min(max(base - after, 0.0), bound)
        if saving is None:
            out.append(msgspec.structs.replace(finding, bound_ms_per_step=bound, saving_basis=BASIS_BOUND))
        else:
            out.append(msgspec.structs.replace(finding, saving_ms_per_step=min(round(saving, 3), bound),
                                               bound_ms_per_step=bound, saving_basis=BASIS_GRAPH))
    return out
