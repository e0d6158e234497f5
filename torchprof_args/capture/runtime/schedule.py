"""The profiling schedule, evaluated identically on every rank.

Because every rank computes the same actions from the same flags and iteration numbers, every
rank knows the flush iterations without communicating: that is what lets non-profiled ranks meet
profiled ones at a CPU barrier instead of waiting inside an NCCL collective.

Iterations are the 1-based global numbers of optimizer steps: the training loop calls
``prof.step(iteration)`` right after iteration ``iteration`` finished, so after a resume from a
checkpoint at iteration N the next call is ``prof.step(N + 1)``.

Two modes:

* relative (torch.profiler.schedule semantics): ``skip_first`` steps *of this run*, then cycles of
  ``wait`` + ``warmup`` + ``active`` steps, ``repeat`` times (0 = forever);
* absolute (``--torch-profile-step-start/-end``, Megatron style, resume-safe): record iterations
  ``step_start <= i < step_end`` with ``warmup`` steps before ``step_start``.
"""

from __future__ import annotations

import dataclasses
import enum

from torchprof_args.capture.runtime import flags


class Action(enum.Enum):
    """What the profiler does during one iteration (mirrors ``torch.profiler.ProfilerAction``)."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


#: The actions during which torch.profiler records (and nsys captures).
RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)


@dataclasses.dataclass(frozen=True)
class ProfileSchedule:
    """Which iterations are warmed up, recorded, and flushed: the same answer on every rank, with no
    communication (torch.profiler's ``schedule``, plus absolute windows).

    Attributes:
        wait: idle iterations at the start of each cycle.
        warmup: iterations the profiler runs but discards, before each recorded window.
        active: iterations recorded per cycle (at least 1).
        repeat: cycles (0: until the run ends).
        skip_first: iterations skipped once, before the first cycle.
        step_start: an absolute window's first iteration (None: the relative schedule above).
        step_end: its end, exclusive (default ``step_start + active``).

    Raises:
        ValueError: a negative count, no active step, or an empty absolute window.
    """

    wait: int = flags.WAIT.default
    warmup: int = flags.WARMUP.default
    active: int = flags.ACTIVE.default
    repeat: int = flags.REPEAT.default
    skip_first: int = flags.SKIP_FIRST.default
    step_start: int | None = None
    step_end: int | None = None

    def __post_init__(self) -> None:
        if self.active < 1:
            raise ValueError("active must be >= 1")
        if min(self.wait, self.warmup, self.repeat, self.skip_first) < 0:
            raise ValueError("wait, warmup, repeat and skip_first must be >= 0")
        if self.step_end is not None and self.step_start is None:
            raise ValueError("step_end needs step_start")
        if self.step_start is not None and self.step_end is None:  # as the flags do
            object.__setattr__(self, "step_end", self.step_start + self.active)
        if self.step_start is not None and self.step_end is not None and self.step_end <= self.step_start:
            raise ValueError("step_end must be greater than step_start")

    @property
    def absolute(self) -> bool:
        """Whether the schedule is an absolute window (``step_start``), not cycles."""
        return self.step_start is not None

    @property
    def window(self) -> tuple[int, int] | None:
        """``(step_start, step_end)`` of an absolute schedule; None for a relative one."""
        if self.step_start is None or self.step_end is None:
            return None
        return self.step_start, self.step_end

    @property
    def cycle_length(self) -> int:
        """Iterations per cycle: wait + warmup + active."""
        return self.wait + self.warmup + self.active

    def action(self, iteration: int, first_iteration: int = 1) -> Action:
        """What the profiler does at an iteration.

        Args:
            iteration: the 1-based global iteration.
            first_iteration: the first iteration of this run (after a resume, not 1).

        Returns:
            NONE, WARMUP, RECORD, or RECORD_AND_SAVE (the window's last iteration: the flush).
        """
        if self.window is not None:
            start, end = self.window
            if start <= iteration < end:
                return Action.RECORD_AND_SAVE if iteration == end - 1 else Action.RECORD
            if start - self.warmup <= iteration < start:
                return Action.WARMUP
            return Action.NONE
        step = iteration - first_iteration - self.skip_first
        if step < 0:
            return Action.NONE
        if self.repeat and step >= self.repeat * self.cycle_length:
            return Action.NONE
        phase = step % self.cycle_length
        if phase < self.wait:
            return Action.NONE
        if phase < self.wait + self.warmup:
            return Action.WARMUP
        return Action.RECORD_AND_SAVE if phase == self.cycle_length - 1 else Action.RECORD

    def next_busy_iteration(self, after: int, first_iteration: int = 1) -> int | None:
        """The next iteration whose action is not NONE: what lets the hot path skip idle iterations with one
        integer comparison.

        Args:
            after: the current iteration.
            first_iteration: the first iteration of this run.

        Returns:
            The smallest such iteration greater than ``after``, or None when none is left.
        """
        candidate = after + 1
        if self.window is not None:
            start, end = self.window
            begin = max(candidate, start - self.warmup)
            return begin if begin < end else None
        step = candidate - first_iteration - self.skip_first
        if step < 0:
            candidate, step = first_iteration + self.skip_first, 0
        if self.repeat and step >= self.repeat * self.cycle_length:
            return None
        phase = step % self.cycle_length
        if phase < self.wait:
            candidate += self.wait - phase
            step += self.wait - phase
            if self.repeat and step >= self.repeat * self.cycle_length:
                return None
        return candidate

    def recorded_range(self, flush_iteration: int, first_iteration: int = 1) -> tuple[int, int]:
        """The recorded iterations of the cycle flushed at an iteration.

        Args:
            flush_iteration: the cycle's RECORD_AND_SAVE iteration.
            first_iteration: the first iteration of this run.

        Returns:
            Its first and last recorded iterations (the cycle folder's ``iterA-B``).
        """
        first = flush_iteration
        while first - 1 >= first_iteration and self.action(first - 1, first_iteration) is Action.RECORD:
            first -= 1
        return first, flush_iteration

    def describe(self) -> str:
        """The schedule in one line, for logs (e.g. ``skip 1 step(s), then 1 cycle(s) of wait 0 /
        warmup 1 / active 1``).
        """
        if self.window is not None:
            start, end = self.window
            return f"record iterations {start}..{end - 1} after {self.warmup} warmup step(s)"
        cycles = "until the run ends" if self.repeat == 0 else f"{self.repeat} cycle(s)"
        return (
            f"skip {self.skip_first} step(s), then {cycles} of wait {self.wait} / "
            f"warmup {self.warmup} / active {self.active}"
        )
