"""A busy step's collective decisions, taken before its plan, the same on every rank.

At a busy step every rank first agrees on what may change the window: the on-demand window at a
check iteration (:class:`~torchprof_args.capture.ondemand.controller.OnDemandController`), the low-memory
vote, which may cut the window recording now (:class:`~.host_resources.WindowMemoryGuard`), and
the publishing vote, which may skip the window beginning next step (:class:`~.publishing.PublishingVote`;
an on-demand requester then learns why).  Each travels asynchronously on the fence's gloo group,
posted one step and collected the next, so no rank waits in the training thread.  Only then does
:meth:`~.timeline.Timeline.plan` say what the step does.
"""

from __future__ import annotations

import dataclasses

from torchprof_args.capture.ondemand.controller import OnDemandController
from torchprof_args.capture.runtime.fence import Fence
from torchprof_args.capture.runtime.host_resources import WindowMemoryGuard
from torchprof_args.capture.runtime.publish_vote import PublishingVote
from torchprof_args.capture.runtime.schedule import Action
from torchprof_args.capture.runtime.timeline import Timeline
from torchprof_args.log import get_logger

__all__ = ["StepAgreements"]

logger = get_logger(__name__)


@dataclasses.dataclass
class StepAgreements:
    """The decisions one rank takes part in at each busy step, applied to its timeline.

    Attributes:
        timeline: the rank's timeline (its window, its next check).
        fence: the gloo group the decisions travel on.
        memory_guard: the low-memory vote; ``publishing``: the publishing vote.
        rank: this rank.
        on_demand: the on-demand controller, once started (None: on-demand is off).
    """

    timeline: Timeline
    fence: Fence
    memory_guard: WindowMemoryGuard
    publishing: PublishingVote
    rank: int
    on_demand: OnDemandController | None = None

    def take(self, iteration: int) -> None:
        """Take this busy step's decisions (collective: every rank at the same iteration).

        Args:
            iteration: the step just finished.
        """
        timeline = self.timeline
        if iteration >= timeline.next_check:
            self._check_on_demand(iteration)
        if self.memory_guard.enabled:  # may cut the window recording now, on every rank
            self.memory_guard.check(iteration, timeline, rank=self.rank)
        skipped = self.publishing.decide(iteration, timeline)  # may skip the window beginning next step
        window, on_demand = timeline.window, self.on_demand  # a window only with on-demand on
        if skipped and window and on_demand and window.warmup_start <= iteration + 1 < window.end:
            on_demand.window_skipped(window, skipped)  # its requester learns why, not a missing file

    def _check_on_demand(self, iteration: int) -> None:
        """At a check iteration: adopt the window every rank received, plan the next check."""
        timeline, on_demand = self.timeline, self.on_demand
        assert on_demand is not None  # next_check is finite only with on-demand on
        window = on_demand.poll(iteration, self.fence.group,
                                busy=lambda i: timeline.scheduled_action(i) is not Action.NONE)
        if window is not None:
            timeline.window = window
            if window.traces(self.rank):  # DEBUG: rank 0's "accepted" line says it once for all ranks
                logger.debug("rank %d: on-demand request %s: tracing iterations %d..%d", self.rank,
                             window.request_id, window.start, window.end - 1)
        timeline.next_check = on_demand.next_check
