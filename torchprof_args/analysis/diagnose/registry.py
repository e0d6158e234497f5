"""The one list of diagnose kinds, in order: what the command, the sidecar's rank part, the report,
``diff`` and the documentation all read.

Every kind is a module of :mod:`.kinds` with one shape (:class:`KindModule`, checked by
``tests/test_layout.py``):

* ``KIND``: its name, the module's name (``Finding.kind``);
* ``SCOPE``: :attr:`~.context.Scope.PER_RANK` (from one rank's trace, when it is published) or
  :attr:`~.context.Scope.CROSS_RANK` (from one cycle's rank parts, when ``diagnose`` runs);
* ``THRESHOLD``: a :class:`~.finding.Threshold`, below which it reports nothing;
* ``analyze(input, context)``: per rank ``analyze(trace: Trace, kind_ctx: KindContext)``, cross-rank
  ``analyze(ranks: CycleRanks, kind_ctx: KindContext)``, returning a Finding, a Gap or None.

:data:`REGISTRY`'s order is the evaluation order (each kind's context holds the findings of the kinds
of its scope before it: ``low_mfu`` runs last of the per-rank kinds and saves what the others leave;
``straggler`` runs after ``expert_imbalance`` and leaves it the ranks whose excess is routed
tokens; ``collective_skew`` runs after both and leaves out what their extra work explains) and the
order docs/guides/diagnose-kinds.md lists them in.

To add a kind: write ``kinds/<kind>.py`` with the four names (a test injects the problem into a
real trace and requires the finding at its size; it imports no other kind: what kinds share is in
:mod:`.spans`, :mod:`.launches`, :mod:`.kind_names`), add the module to :data:`REGISTRY` where it
belongs in the order, and document it and its threshold in docs/guides/diagnose-kinds.md (a test
compares the table with this registry).
"""

from __future__ import annotations

from typing import Protocol, cast

from torchprof_args.analysis.diagnose.context import KindContext, Scope
from torchprof_args.analysis.diagnose.cycle import CycleRanks
from torchprof_args.analysis.diagnose.finding import Finding, Gap, Threshold
from torchprof_args.analysis.diagnose.kinds import (
    collective_skew,
    dataloader_stall,
    expert_imbalance,
    exposed_comm,
    gpu_idle,
    host_sync,
    launch_bound,
    low_mfu,
    memcpy,
    memory_imbalance,
    mfu_disagreement,
    pipeline_bubble,
    straggler,
)
from torchprof_args.analysis.trace import Trace

__all__ = ["CROSS_RANK", "KINDS", "PER_RANK", "REGISTRY", "CrossRankKind", "KindModule", "PerRankKind"]


class KindModule(Protocol):
    """What every module of :mod:`.kinds` defines."""

    KIND: str
    SCOPE: Scope
    THRESHOLD: Threshold


class PerRankKind(KindModule, Protocol):
    """A kind computed from one rank's trace."""

    def analyze(self, trace: Trace, kind_ctx: KindContext, /) -> Finding | Gap | None: ...


class CrossRankKind(KindModule, Protocol):
    """A kind computed from one cycle's rank parts."""

    def analyze(self, ranks: CycleRanks, kind_ctx: KindContext, /) -> Finding | Gap | None: ...


#: every kind, in evaluation and documentation order (per-rank kinds first, then cross-rank ones).
REGISTRY: tuple[KindModule, ...] = (
    gpu_idle, exposed_comm, pipeline_bubble, launch_bound, host_sync, dataloader_stall, memcpy, low_mfu,
    expert_imbalance, straggler, collective_skew, memory_imbalance, mfu_disagreement,
)
#: every kind's name, in :data:`REGISTRY`'s order.
KINDS: tuple[str, ...] = tuple(k.KIND for k in REGISTRY)
#: the kinds computed from one rank's trace, in order.
PER_RANK: tuple[PerRankKind, ...] = tuple(cast(PerRankKind, k) for k in REGISTRY if k.SCOPE is Scope.PER_RANK)
#: the kinds computed from one cycle's rank parts, in order.
CROSS_RANK: tuple[CrossRankKind, ...] = tuple(
    cast(CrossRankKind, k) for k in REGISTRY if k.SCOPE is Scope.CROSS_RANK)
