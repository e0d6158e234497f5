"""Which action each global iteration has, and what a step must do: the same on every rank.

The schedule's cycles come first, then the on-demand window every rank adopted at the same check
iteration, minus the end of a window that low host memory cut short (a decision every rank took
at the same iteration).  :meth:`Timeline.plan` turns that into a :class:`StepPlan`: everything
:class:`~torchprof_args.capture.runtime.profiler.TorchProfiler` does at a busy step, and the next busy
step.  Idle steps never get here.  Import-light: no torch, so plans are tested on their own.
"""

from __future__ import annotations

import dataclasses
import math

from torchprof_args.capture.ondemand.window import OnDemandWindow
from torchprof_args.capture.runtime.schedule import RECORDING, Action, ProfileSchedule
from torchprof_args.log import get_logger

__all__ = ["FENCE_FLUSH", "FENCE_SNAPSHOT", "StepPlan", "Timeline", "window_action"]

logger = get_logger(__name__)

#: Why every rank meets at the fence after a step (the fence logs it).
FENCE_FLUSH = "flush"
FENCE_SNAPSHOT = "memory snapshot"


def window_action(window: OnDemandWindow, iteration: int) -> Action:
    """The on-demand ``window``'s profiler action for ``iteration`` (the same on every rank)."""
    if window.start <= iteration < window.end:
        return Action.RECORD_AND_SAVE if iteration == window.end - 1 else Action.RECORD
    if window.warmup_start <= iteration < window.start:
        return Action.WARMUP
    return Action.NONE


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """What the step that ends ``iteration`` does, decided from the timeline alone.

    Every field but ``record``/``record_next`` is the same on every rank, so every rank meets at
    the same fences.
    """

    iteration: int
    #: Every rank's action at ``iteration`` (RECORD_AND_SAVE: a window is flushed now).
    action: Action
    #: This rank's torch.profiler action at ``iteration`` and at ``iteration + 1`` (the transition).
    record: Action
    record_next: Action
    #: Why every rank meets at the fence after this step (FENCE_FLUSH, FENCE_SNAPSHOT), or None.
    fence: str | None
    #: A scheduled cycle ends here: the memory snapshotter dumps its snapshot.
    cycle_snapshot: bool
    #: nsys captures ``iteration + 1`` (scheduled windows only: the capture range is static).
    nsys_recording: bool
    #: The on-demand window ends with this step: the timeline forgets it afterwards.
    window_ends: bool
    #: The next iteration whose step has work (math.inf: none is planned).
    next_busy: float

    @property
    def flush(self) -> bool:
        return self.action is Action.RECORD_AND_SAVE


class Timeline:
    """Actions per iteration for every rank (``global_action``) and for this one (``local_action``).

    ``scheduled``: whether the schedule is followed at all (traces, snapshots, nsys); ``record``:
    whether this rank records the schedule's windows.  The profiler sets the other inputs of a
    plan: ``next_check`` (the next on-demand check every rank makes), ``snapshot_interval``
    (every rank fences at its multiples) and ``every_step`` (nsys opens an NVTX range per step).
    """

    def __init__(self, schedule: ProfileSchedule, *, scheduled: bool, first_iteration: int, rank: int,
                 record: bool) -> None:
        self.schedule = schedule
        self.scheduled = scheduled
        self.first_iteration = first_iteration
        self.rank = rank
        self.record = record
        self.window: OnDemandWindow | None = None
        self.anchored = False
        #: (iteration, planned last iteration) of a window ended early.
        self.cut: tuple[int, int] | None = None
        #: (first, last) iteration of a window skipped on every rank (publishing was behind).
        self.skipped: tuple[int, int] | None = None
        #: The publishing vote is posted two steps before each window: that step is busy too.
        self.vote_ahead = False
        self.next_check: float = math.inf
        self.snapshot_interval = 0
        self.every_step = False

    def scheduled_action(self, iteration: int) -> Action:
        if not self.scheduled:
            return Action.NONE
        return self.schedule.action(iteration, self.first_iteration)

    def global_action(self, iteration: int) -> Action:
        """The action every rank agrees on (fenced flushes)."""
        return self._global_action(iteration, self.window)

    def local_action(self, iteration: int) -> Action:
        """What this rank's torch.profiler does: only for the ranks the schedule or request names."""
        action = self.global_action(iteration)
        if action is Action.NONE:
            return action
        if self.scheduled_action(iteration) is not Action.NONE:
            return action if self.record else Action.NONE
        return action if self.window is not None and self.window.traces(self.rank) else Action.NONE

    def plan(self, iteration: int) -> StepPlan:
        """The plan of the step that ends ``iteration``, from what the timeline knows now (after
        this step's on-demand decision and low-memory vote, which may change the window)."""
        action = self.global_action(iteration)
        window = self.window
        window_ends = window is not None and iteration >= window.end - 1
        every = self.snapshot_interval
        snapshot_due = every > 0 and iteration > 0 and iteration % every == 0
        flush = action is Action.RECORD_AND_SAVE
        return StepPlan(
            iteration=iteration,
            action=action,
            record=self.local_action(iteration),
            record_next=self.local_action(iteration + 1),
            fence=FENCE_FLUSH if flush else FENCE_SNAPSHOT if snapshot_due else None,
            cycle_snapshot=flush and self.scheduled_action(iteration) is not Action.NONE,
            nsys_recording=self.scheduled_action(iteration + 1) in RECORDING,
            window_ends=window_ends,
            next_busy=self._next_busy(iteration, None if window_ends else window),
        )

    def window_last(self, first: int) -> int:
        """The last iteration of the window recording at ``first`` (as planned now)."""
        last = first
        while self.global_action(last) is Action.RECORD:
            last += 1
        return last

    def cut_window(self, iteration: int) -> int:
        """End the window recording at ``iteration`` there; returns the iteration it was to end at."""
        planned_last = self.window_last(iteration)
        self.cut = (iteration, planned_last)
        return planned_last

    def window_starts(self, iteration: int) -> bool:
        """A window (its warmup, or its first recorded step) begins at ``iteration`` on every rank."""
        return (self.global_action(iteration) is not Action.NONE
                and self.global_action(iteration - 1) in (Action.NONE, Action.RECORD_AND_SAVE))

    def skip_window(self, first: int) -> int:
        """Skip the window beginning at ``first`` (nothing recorded, no flush, no fence); returns its
        flush iteration.  Called at the step before ``first``, on every rank."""
        last = first
        while self.global_action(last) in (Action.WARMUP, Action.RECORD):
            last += 1
        self.skipped = (first, last)
        return last

    def anchor(self, iteration: int) -> None:
        """Align the schedule with the caller's numbering at the first ``step`` call.

        A relative schedule counts steps of this run, so it follows the caller's first number.
        An absolute window that began before this run's first step cannot be recorded.
        """
        self.anchored = True
        if iteration == self.first_iteration:
            return
        window = self.schedule.window
        if window is None:
            self.first_iteration = iteration
        elif window[0] <= iteration < window[1]:
            logger.warning("rank %d: the run started at iteration %d, inside --torch-profile-step-start/"
                           "-end; pass start_iteration to TorchProfiler.from_args (or set args.iteration) so "
                           "the window is not missed", self.rank, iteration)

    def _global_action(self, iteration: int, window: OnDemandWindow | None) -> Action:
        action = self.scheduled_action(iteration)
        if action is Action.NONE and window is not None:
            action = window_action(window, iteration)
        skipped = self.skipped
        if skipped is not None and skipped[0] <= iteration <= skipped[1]:
            return Action.NONE
        cut = self.cut
        if cut is not None and cut[0] <= iteration <= cut[1]:
            return Action.RECORD_AND_SAVE if iteration == cut[0] else Action.NONE
        return action

    def _next_busy(self, iteration: int, window: OnDemandWindow | None) -> float:
        """The first iteration after ``iteration`` whose step has work, ``window`` being the
        on-demand window still known after this step: a transition, a flush, the next on-demand
        check, a snapshot interval, or every step for nsys."""
        if self.every_step or self._global_action(iteration + 1, window) is not Action.NONE:
            return iteration + 1
        candidates = [self.next_check]
        if self.snapshot_interval > 0:
            candidates.append((iteration // self.snapshot_interval + 1) * self.snapshot_interval)
        if self.scheduled:
            busy = self.schedule.next_busy_iteration(iteration + 1, self.first_iteration)
            if busy is not None:
                candidates.append(self._before(busy, iteration))
        if window is not None:
            candidates.append(self._before(window.warmup_start, iteration))
        return min(candidates, default=math.inf)

    def _before(self, busy: int, iteration: int) -> int:
        """The busy step ahead of a window beginning at ``busy``: the step before it, or the one
        before that for the publishing vote (when it is still ahead of ``iteration``)."""
        return busy - 2 if self.vote_ahead and busy - 2 > iteration else busy - 1
