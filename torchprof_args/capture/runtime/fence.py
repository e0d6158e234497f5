"""The fence: where every rank waits for a rank that profiling holds up.

A trace export, a memory dump or a publisher at exit can keep one rank busy for minutes.  If the
other ranks went on into their next NCCL collective they would wait there, under the NCCL
watchdog's timeout, and the job would die.  Instead every rank meets at a barrier on a dedicated
**gloo** process group created up front with a long timeout (``--torch-profile-flush-timeout``):
waiting there is harmless to NCCL, and since every rank evaluates the same schedule, every rank
arrives at the same iteration without communicating.  Every such pause goes through
:meth:`Fence.wait`: scheduled and on-demand flushes, memory snapshots (the OOM dump excepted:
training is dying) and the exit.

The same group carries on-demand tracing's decision broadcasts, the low-memory votes of
recording windows and the publishing vote before each window (:meth:`post_vote` /
:meth:`collect_vote` by kind: asynchronous, collected one step later, so no rank ever blocks on
them).  One extra process group per job, created in
:meth:`Fence.open` (a collective: every rank must call it).

Hooks: ``on_failure`` callables run (on the failing rank) when a barrier times out or breaks,
e.g. to dump a flight recorder; they get ``(iteration, what, error)``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from torchprof_args import _dist
from torchprof_args.log import get_logger

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup, Work

__all__ = ["Fence"]

logger = get_logger(__name__)

FailureHook = Callable[[int, str, BaseException], None]
_Item = TypeVar("_Item")


def _synchronize_device() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Fence:
    """A gloo barrier group with a long timeout; a no-op in a single process."""

    def __init__(self, timeout: float, rank: int) -> None:
        self.timeout = timeout
        self.rank = rank
        self.group: ProcessGroup | None = None
        self.world_size = 1
        self.on_failure: list[FailureHook] = []
        self.waits = 0
        #: kind -> the all-reduce in flight and its tensor (one row per rank)
        self._votes: dict[str, tuple[Work, torch.Tensor]] = {}
        #: kind -> this process's row (a single process: nothing to reduce)
        self._local_votes: dict[str, list[int]] = {}

    def open(self, world_size: int) -> None:
        """Collective: create the gloo group (when several ranks share a process group)."""
        dist = _dist.dist_if_initialized()
        self.world_size = world_size
        if self.group is not None or world_size <= 1 or dist is None:
            return
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))

    def wait(self, iteration: int, what: str = "flush") -> bool:
        """Synchronise the device, then wait for every rank; False (logged, hooks run) if the barrier
        failed."""
        self.waits += 1
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
                         "--torch-profile-flush-timeout if exports take longer.", self.rank, what, iteration,
                         err)
            self._run_failure_hooks(iteration, what, err)
            return False

    def _run_failure_hooks(self, iteration: int, what: str, err: BaseException) -> None:
        for hook in list(self.on_failure):
            try:
                hook(iteration, what, err)
            except Exception as hook_err:  # noqa: BLE001
                logger.error("rank %d: fence failure hook %r failed: %s", self.rank, hook, hook_err)

    def agree(self, item: _Item) -> list[_Item]:
        """Collective, blocking: every rank's ``item`` (start-up agreements only, never per step;
        a picklable object of the same type on every rank)."""
        if self.group is None:
            return [item]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, item, group=self.group)
        return gathered

    # -- votes: small integers per rank, collected one step later -------------------------------

    def post_vote(self, value: int | Sequence[int], kind: str = "memory") -> None:
        """Post this rank's ``value`` (>= 0, or a fixed-length row of them) for the vote ``kind``;
        every rank posts the same kinds at the same iterations, in the same order.  Collect a value
        with :meth:`collect_vote`, a row with :meth:`collect_rows`."""
        row = [value] if isinstance(value, int) else list(value)
        if self.group is None:
            self._local_votes[kind] = row
            return
        import torch
        import torch.distributed as dist

        votes = torch.zeros(self.world_size, len(row), dtype=torch.int64)
        votes[self.rank] = torch.tensor(row, dtype=torch.int64)
        with _dist.unrecorded():  # inside a recording window: not one of the job's collectives
            work = dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            self._votes[kind] = (work, votes)

    @property
    def vote_pending(self) -> bool:
        """The low-memory vote is in flight (see :meth:`pending`)."""
        return self.pending("memory")

    def pending(self, kind: str) -> bool:
        return kind in self._votes or kind in self._local_votes

    def collect_vote(self, timeout: float | None = None, kind: str = "memory") -> list[int] | None:
        """Every rank's value posted at the last :meth:`post_vote` of ``kind`` (None when none is
        pending or it failed); the first of each row when rows were posted."""
        rows = self.collect_rows(timeout, kind)
        return None if rows is None else [row[0] for row in rows]

    def collect_rows(self, timeout: float | None = None, kind: str = "memory") -> list[list[int]] | None:
        """Every rank's row posted at the last :meth:`post_vote` of ``kind`` (None when none is
        pending or it failed)."""
        local = self._local_votes.pop(kind, None)
        if local is not None:
            return [local]
        pending = self._votes.pop(kind, None)
        if pending is None:
            return None
        work, votes = pending
        try:
            _dist.wait(work, timeout)
        except Exception as err:  # noqa: BLE001
            logger.error("rank %d: %s vote on the fence group failed (%s); training continues", self.rank,
                         kind, err)
            return None
        return [[int(v) for v in row] for row in votes.tolist()]
