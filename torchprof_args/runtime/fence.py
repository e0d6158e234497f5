"""The fence: where every rank waits for a rank that profiling holds up.

A trace export or a memory dump can keep one rank busy for minutes.  If the other ranks went on
into their next NCCL collective they would wait there, under the NCCL watchdog's timeout, and
the job would die.  Instead every rank meets at a barrier on a dedicated **gloo** process group
created up front with a long timeout (``--torch-profile-flush-timeout``): waiting there is
harmless to NCCL, and since every rank evaluates the same schedule, every rank arrives at the
same iteration without communicating.

The same group carries on-demand tracing's small decision broadcasts, so there is one extra
process group per job, created in :meth:`Fence.open` (a collective: every rank must call it).
"""

from __future__ import annotations

import datetime
from typing import Any

from torchprof_args import _dist
from torchprof_args.log import get_logger

__all__ = ["Fence"]

logger = get_logger(__name__)


def _synchronize_device() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Fence:
    """A gloo barrier group with a long timeout; a no-op in a single process."""

    def __init__(self, timeout: float, rank: int) -> None:
        self.timeout = timeout
        self.rank = rank
        self.group: Any = None
        #: Called with a reason when the barrier fails (the flight recorder dumps then).
        self.on_failure: Any = None

    def open(self, world_size: int) -> None:
        """Collective: create the gloo group (when several ranks share a process group)."""
        dist = _dist.dist_if_initialized()
        if self.group is not None or world_size <= 1 or dist is None:
            return
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))

    def wait(self, iteration: int, what: str = "flush") -> bool:
        """Synchronise the device, then wait for every rank; False (logged) if the barrier failed."""
        try:
            _synchronize_device()
        except Exception as err:  # noqa: BLE001 - a sick device must not stop the others here
            logger.error("rank %d: device synchronize before the %s barrier failed: %s", self.rank, what, err)
        if self.group is None:
            return True
        import torch.distributed as dist

        try:
            dist.monitored_barrier(group=self.group, timeout=datetime.timedelta(seconds=self.timeout),
                                   wait_all_ranks=True)
            return True
        except Exception as err:  # noqa: BLE001 - profiling must never stop training
            logger.error("rank %d: %s barrier at iteration %d failed (%s); training continues. Raise "
                         "--torch-profile-flush-timeout if exports take longer.", self.rank, what, iteration, err)
            if self.on_failure is not None:
                self.on_failure(f"the {what} barrier at iteration {iteration} failed: {str(err)[:200]}")
            return False
