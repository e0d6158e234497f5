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
    """Which iterations are warmed up, recorded, and flushed."""

    wait: int = 0
    warmup: int = 1
    active: int = 1
    repeat: int = 1
    skip_first: int = 1
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
        return self.step_start is not None

    @property
    def window(self) -> tuple[int, int] | None:
        """``(step_start, step_end)`` of an absolute schedule; None for a relative one."""
        if self.step_start is None or self.step_end is None:
            return None
        return self.step_start, self.step_end

    @property
    def cycle_length(self) -> int:
        return self.wait + self.warmup + self.active

    def action(self, iteration: int, first_iteration: int = 1) -> Action:
        """The action for ``iteration``; ``first_iteration`` is the first iteration of this run."""
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
        """The smallest iteration ``> after`` whose action is not NONE, or None if none is left.

        Lets the hot path skip idle iterations with one integer comparison.
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
        """The first and last recorded iterations of the cycle flushed at ``flush_iteration``."""
        first = flush_iteration
        while first - 1 >= first_iteration and self.action(first - 1, first_iteration) is Action.RECORD:
            first -= 1
        return first, flush_iteration

    def describe(self) -> str:
        """One line for logs."""
        if self.window is not None:
            start, end = self.window
            return f"record iterations {start}..{end - 1} after {self.warmup} warmup step(s)"
        cycles = "until the run ends" if self.repeat == 0 else f"{self.repeat} cycle(s)"
        return (
            f"skip {self.skip_first} step(s), then {cycles} of wait {self.wait} / "
            f"warmup {self.warmup} / active {self.active}"
        )
