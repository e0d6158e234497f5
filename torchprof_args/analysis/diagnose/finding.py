"""Findings: what ``torchprof diagnose`` reports, one problem each, with what fixing it would save.

Every analyzer of ``analysis/analyzers/`` that diagnoses (one module per kind, HTA style) returns,
for one rank's :class:`~torchprof_args.analysis.trace.Trace`, a :class:`Finding` (the problem is
there, with its size), a :class:`Gap` (the trace lacks what the analysis needs, and the flag that
would record it) or None (nothing to report: below the kind's documented threshold).  Per-rank
findings are JSON (:meth:`Finding.to_json`) so the publisher keeps them in the summary sidecar and
``diagnose`` merges 512 ranks' findings without reading a trace.  Cross-rank kinds (``straggler``,
``collective_skew``) are computed from many ranks' summaries and use the same type.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FINDINGS_VERSION", "KINDS", "Finding", "Gap"]

#: the ``version`` of ``torchprof diagnose --json``'s schema (bumped on any incompatible change).
FINDINGS_VERSION = 1

#: every kind, in the order the documentation lists them.
KINDS = (
    "gpu_idle", "exposed_comm", "pipeline_bubble", "launch_bound", "host_sync",
    "dataloader_stall", "straggler", "collective_skew", "low_mfu", "memcpy",
)


@dataclass(frozen=True)
class Finding:
    """One problem, measured per step.

    ``ms_per_step``: the time the problem takes in a mean step; ``share_of_step`` that over the
    step time; ``saving_ms_per_step``: what fixing it would save at most, per step, and
    ``saving_bound`` one phrase saying how that was bounded (e.g. "exposed time only: compute is
    not shortened").  ``evidence``: JSON values only (top kernels / operators / call sites as lists
    of ``{"name", "ms_per_step"}``, ``"perfetto_ts_us"`` of the worst instance, counts).
    ``remedy``: the usual fix, one line.  ``summary``: one sentence for the text output.
    """

    kind: str
    summary: str
    ranks: tuple[int, ...]
    ms_per_step: float
    share_of_step: float
    saving_ms_per_step: float
    saving_bound: str
    remedy: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")

    def to_json(self) -> dict[str, Any]:
        """The finding as ``diagnose --json`` prints it (and the sidecar stores it)."""
        doc = asdict(self)
        doc["ranks"] = list(self.ranks)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Finding:
        """The inverse of :meth:`to_json` (a sidecar's stored finding)."""
        return cls(**{**doc, "ranks": tuple(doc["ranks"])})


@dataclass(frozen=True)
class Gap:
    """A kind the trace cannot answer, and how to record what it needs.

    ``flag``: the option that would (e.g. ``--torch-profile-with-stack``); ``reason``: one
    sentence ("the trace has no Python stacks, so the synchronisation has no call site").
    """

    kind: str
    reason: str
    flag: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
