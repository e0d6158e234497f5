"""Findings: what ``torchprof diagnose`` reports, one problem each, with what fixing it would save.

Every diagnose kind (one module each in :mod:`.kinds`, listed by :mod:`.registry`) returns a
:class:`Finding` (the problem is there, with its size), a :class:`Gap` (the traces lack what the
kind needs, and the flag that would record it) or None (nothing to report: below the kind's
:class:`Threshold`).  Both are msgspec structs: a rank's findings are kept in its summary sidecar
(:class:`~.documents.RankDiagnosis`) so that ``diagnose`` merges 512 ranks' findings without
reading a trace, and printed as they are by ``diagnose --json``.
"""

from __future__ import annotations

import functools
import pkgutil
from typing import Any

import msgspec

from torchprof_args.analysis.diagnose import kinds as kinds_package

__all__ = ["NO_THRESHOLD", "Finding", "Gap", "Threshold", "kind_modules", "no_gpu_gap"]


@functools.cache
def kind_modules() -> frozenset[str]:
    """The names of the modules in :mod:`.kinds`: a finding's ``kind`` is one of them (the registry
    lists every one; ``tests/test_layout.py`` checks both agree).  Read from the package's
    folder, so that this check imports no kind (they import this module)."""
    modules = pkgutil.iter_modules(kinds_package.__path__)
    return frozenset(m.name for m in modules if not m.name.startswith("_"))


class Threshold(msgspec.Struct, frozen=True):
    """When a kind reports: the time it measures per mean step must reach both values.

    Attributes:
        share_of_step: at least this share of the step (0..1);
        min_ms: and at least this many milliseconds per step.
    """

    share_of_step: float = 0.0
    min_ms: float = 0.0

    def reached(self, ms_per_step: float, share_of_step: float | None) -> bool:
        """Whether a measurement reports.

        Args:
            ms_per_step: the measured time per mean step.
            share_of_step: the same as a share of the step; None when the step is unknown (then
                only ``min_ms`` applies).

        Returns:
            True when both values are reached.
        """
        return ms_per_step >= self.min_ms and (share_of_step is None or share_of_step >= self.share_of_step)

    def describe(self) -> str:
        """The threshold as the documentation's table states it, e.g. ``2 % of the step and 0.5 ms``."""
        text = f"{100 * self.share_of_step:g} % of the step"
        return text + (f" and {self.min_ms:g} ms" if self.min_ms else "")


#: every measurement reports (``KindContext(thresholds_off=True)``: tests, calibration).
NO_THRESHOLD = Threshold()


class Finding(msgspec.Struct, frozen=True):
    """One problem, measured per step.

    ``ms_per_step``: the time the problem takes in a mean step; ``share_of_step`` that over the
    step time; ``saving_ms_per_step``: what fixing it would save per step: in a job's diagnosis the
    step the critical path predicts without the cause (``saving_basis`` ``"critical path"``), else
    the per-rank bound (``"bound"``); ``bound_ms_per_step``: that per-rank bound (what it saves at
    most on the rank), and ``saving_bound`` one phrase saying how it was bounded (e.g. "exposed
    time only: compute is not shortened").  ``evidence``: JSON values only (top kernels / operators /
    call sites as lists
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
    evidence: dict[str, Any] = msgspec.field(default_factory=dict)
    bound_ms_per_step: float | None = None
    saving_basis: str = "bound"

    def __post_init__(self) -> None:
        if self.kind not in kind_modules():
            raise ValueError(f"unknown finding kind {self.kind!r}")


class Gap(msgspec.Struct, frozen=True):
    """A kind the trace cannot answer, and how to record what it needs.

    ``flag``: the option that would (e.g. ``--torch-profile-with-stack``); ``reason``: one
    sentence ("the trace has no Python stacks, so the synchronisation has no call site").
    """

    kind: str
    reason: str
    flag: str | None = None


def no_gpu_gap(kind: str) -> Gap:
    """The Gap of a GPU kind on a trace without kernels."""
    return Gap(kind, "the trace has no GPU kernels (a CPU-only run or CPU activity only), so the GPU "
                     "cannot be analysed", "--torch-profile-activities cpu cuda")
