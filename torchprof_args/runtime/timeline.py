"""Which action each global iteration has: the same answer on every rank, without communicating.

The schedule's cycles come first, then the on-demand window every rank adopted at the same check
iteration, minus the end of a window that low host memory cut short (a decision every rank took
at the same iteration).  :class:`~torchprof_args.runtime.profiler.TorchProfiler` asks the timeline
at busy steps only; idle steps never get here.
"""

from __future__ import annotations

import math

from torchprof_args.log import get_logger
from torchprof_args.ondemand.window import OnDemandWindow
from torchprof_args.runtime.schedule import Action, ProfileSchedule

__all__ = ["Timeline"]

logger = get_logger(__name__)


class Timeline:
    """Actions per iteration for every rank (``global_action``) and for this one (``local_action``).

    ``scheduled``: whether the schedule is followed at all (traces, snapshots, nsys); ``record``:
    whether this rank records the schedule's windows.
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

    def scheduled_action(self, iteration: int) -> Action:
        if not self.scheduled:
            return Action.NONE
        return self.schedule.action(iteration, self.first_iteration)

    def global_action(self, iteration: int) -> Action:
        """The action every rank agrees on (fenced flushes)."""
        action = self.scheduled_action(iteration)
        if action is Action.NONE and self.window is not None:
            action = self.window.action(iteration)
        cut = self.cut
        if cut is not None and cut[0] <= iteration <= cut[1]:
            return Action.RECORD_AND_SAVE if iteration == cut[0] else Action.NONE
        return action

    def local_action(self, iteration: int) -> Action:
        """What this rank's torch.profiler does: only for the ranks the schedule or request names."""
        action = self.global_action(iteration)
        if action is Action.NONE:
            return action
        if self.scheduled_action(iteration) is not Action.NONE:
            return action if self.record else Action.NONE
        return action if self.window is not None and self.window.traces(self.rank) else Action.NONE

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

    def next_busy(self, iteration: int, candidates: list[float]) -> float:
        """The first iteration after ``iteration`` whose step has work (``candidates``: other
        components' next busy iterations)."""
        if self.global_action(iteration + 1) is not Action.NONE:
            return iteration + 1
        candidates = list(candidates)
        if self.scheduled:
            busy = self.schedule.next_busy_iteration(iteration + 1, self.first_iteration)
            if busy is not None:
                candidates.append(busy - 1)
        if self.window is not None:
            candidates.append(self.window.warmup_start - 1)
        return min(candidates, default=math.inf)

    def anchor(self, iteration: int) -> None:
        """Align the schedule with the caller's numbering at the first ``step`` call.

        A relative schedule counts steps of this run, so it follows the caller's first number.
        An absolute window that began before this run's first step cannot be recorded.
        """
        self.anchored = True
        if iteration == self.first_iteration:
            return
        if not self.schedule.absolute:
            self.first_iteration = iteration
        elif self.schedule.step_start <= iteration < self.schedule.step_end:
            logger.warning("rank %d: the run started at iteration %d, inside --torch-profile-step-start/-end; "
                           "pass start_iteration to TorchProfiler.from_args (or set args.iteration) so the window "
                           "is not missed", self.rank, iteration)
