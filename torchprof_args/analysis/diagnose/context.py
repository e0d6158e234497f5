"""What every diagnose kind declares and is told: its :class:`Scope` and the :class:`KindContext`.

Every kind's ``analyze`` takes its input (one rank's :class:`~torchprof_args.analysis.trace.Trace`,
or one cycle's :class:`~.cycle.CycleRanks`) and a context.  The context carries what a kind may not
measure itself: the findings of the kinds before it in the registry's order (``low_mfu`` saves only
what they leave; ``collective_skew`` leaves out what the stragglers explain), the GPU peak the job
is compared with (``diagnose --peak-tflops`` / ``--peak-dtype``), the step timers' FLOPs, the
framework's tokens per expert, and whether thresholds apply.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from torchprof_args.analysis.diagnose.expert_tokens import ExpertTokens
from torchprof_args.analysis.diagnose.finding import NO_THRESHOLD, Finding, Threshold
from torchprof_args.analysis.diagnose.step_timers import FormulaFlops

__all__ = ["DEFAULT_CONTEXT", "KindContext", "Peak", "Scope"]


class Scope(enum.Enum):
    """What a kind is computed from."""

    #: one rank's trace (when the trace is published, into its sidecar; or when parsed).
    PER_RANK = "per rank"
    #: one cycle's rank parts (:class:`~.cycle.CycleRanks`), when ``diagnose`` runs.
    CROSS_RANK = "across ranks"


@dataclass(frozen=True)
class Peak:
    """The GPU peak ``low_mfu`` compares with.

    Attributes:
        tflops: dense peak TFLOP/s; None: the device table's, by the trace's device name.
        dtype: which of the table's peaks (one of ``device_peaks.DTYPES``).
    """

    tflops: float | None = None
    dtype: str = "bf16"


@dataclass(frozen=True)
class KindContext:
    """What a kind's ``analyze`` is told besides its input.

    Attributes:
        earlier: the findings of the kinds before it in the registry's order (same scope).
        peak: the GPU peak (``low_mfu``).
        thresholds_off: report every measurement, whatever its size (tests, calibration).
        formula: the step timers' model FLOPs per GPU and iteration, where the run logged them
            (``mfu_disagreement``).
        expert_tokens: the framework's tokens per expert, where it logged them (``expert_imbalance``).
    """

    earlier: tuple[Finding, ...] = ()
    peak: Peak = Peak()
    thresholds_off: bool = False
    formula: FormulaFlops | None = None
    expert_tokens: ExpertTokens | None = None

    def threshold(self, documented: Threshold) -> Threshold:
        """The threshold that applies: the kind's documented one, unless thresholds are off."""
        return NO_THRESHOLD if self.thresholds_off else documented

    def earlier_saving_ms(self) -> float:
        """What the earlier findings save per step, together."""
        return sum(f.saving_ms_per_step for f in self.earlier)

    def earlier_of(self, kind: str) -> Finding | None:
        """The earlier finding of ``kind``, None when there is none."""
        return next((f for f in self.earlier if f.kind == kind), None)

    def after(self, found: list[Finding]) -> KindContext:
        """This context for the next kind, once ``found`` are the findings so far."""
        return replace(self, earlier=tuple(found))


#: documented thresholds, the table's bf16 peak, no earlier finding.
DEFAULT_CONTEXT = KindContext()
