"""The on-demand controller inside the training job: every rank agrees on the same windows.

At check iterations every rank calls :meth:`OnDemandController.poll`: rank 0 looks for a request
in the control directory (:class:`~torchprof_args.capture.ondemand.inbox.Inbox`), validates it, writes
the answer, and every rank posts an *asynchronous* broadcast of the fixed-size decision
(:mod:`~torchprof_args.capture.ondemand.wire`) on the fence's gloo group, collected at the next check.
The decision also says when the check after next happens: rank 0 spaces checks about
``--torch-profile-on-demand-check-seconds`` apart from the measured step time (never closer than
``--torch-profile-on-demand-interval`` iterations), so a check costs next to nothing per step
whatever the step time, and a request is taken within about two check periods.  All ranks
agree on the window ``[start, end)`` of global iterations, and its flush is fenced exactly like
a scheduled one.  Problems are logged with the rank and never stop the job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args import _dist
from torchprof_args.capture.ondemand.config import OnDemandConfig
from torchprof_args.capture.ondemand.inbox import Identity, Inbox
from torchprof_args.capture.ondemand.protocol import JOB_FILE
from torchprof_args.capture.ondemand.registry import register_process, unregister_process
from torchprof_args.capture.ondemand.window import OnDemandWindow
from torchprof_args.capture.ondemand.wire import decode_decision, encode_decision
from torchprof_args.errors import OnDemandError
from torchprof_args.log import get_logger
from torchprof_args.naming import short_hostname

if TYPE_CHECKING:  # torch loads only inside the collectives
    import torch
    from torch.distributed import ProcessGroup, Work

__all__ = ["OnDemandController"]

logger = get_logger(__name__)


class OnDemandController:
    """Takes trace requests from the control directory and agrees on windows across ranks.

    Lifecycle: :meth:`setup` (collective, before training), :meth:`open` (advertise the job),
    :meth:`poll` at every check iteration (collective), :meth:`close` (never collective).

    Args:
        config: the on-demand flags' config (control directory, check interval and pacing, limits).
        rank: this rank; ``world_size``: the job's size.
    """

    def __init__(self, config: OnDemandConfig, *, rank: int, world_size: int) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._inbox = Inbox(config, world_size=world_size)
        self.control_dir = self._inbox.control_dir
        self._broken = False
        #: (work, buffer) of the decision broadcast posted at the last check, collected at the next.
        self._pending_decision: tuple[Work, torch.Tensor] | None = None
        #: The next check iteration (all ranks agree) and the one after it (pipelined decisions).
        self.next_check = config.interval
        self._following_check = 2 * config.interval
        #: Rank 0: (iteration, monotonic time) of the previous check, to measure the step time.
        self._previous_check: tuple[int, float] | None = None
        #: Rank 0: the end of the last window it decided; no new request is taken before it.
        self._busy_until = 0
        self._opened = False
        self._registered: Path | None = None
        self.checks = 0

    # -- set-up and tear-down ---------------------------------------------------------------

    def setup(self, group: ProcessGroup | None) -> None:
        """Collective: rank 0 prepares the control directory; all ranks raise if it is unsafe.  Also
        gathers every rank's host, pid and trace directory on rank 0 (the trace file names it answers).

        Args:
            group: the fence's gloo group (None: a single process).

        Raises:
            OnDemandError: several ranks without a process group, or an unsafe control directory.
        """
        if self.world_size > 1 and group is None:
            raise OnDemandError(
                f"--torch-profile-on-demand with WORLD_SIZE {self.world_size} needs torch.distributed "
                "initialised before the profiler starts, so that ranks can agree on trace windows.")
        problem = None
        if self.rank == 0:
            try:
                self._inbox.prepare()
            except OnDemandError as err:
                problem = str(err)
        identity = Identity(short_hostname(), os.getpid(), self._inbox.trace_dir)
        if group is None:
            self._inbox.identities = [identity]
        else:
            import torch.distributed as dist

            message = [problem]
            dist.broadcast_object_list(message, src=0, group=group)
            problem = message[0]
            gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None  # Identity
            dist.gather_object(identity, gathered, dst=0, group=group)
            self._inbox.identities = list(gathered or [])
        if problem:
            raise OnDemandError(problem)

    def open(self) -> None:
        """Advertise the job: rank 0 writes ``job.json``; every rank registers its pid on its node."""
        if self._opened:
            return
        self._opened = True
        self._registered = register_process(self.control_dir, self.rank)
        if self.rank != 0:
            return
        try:
            self._inbox.write_job_file("running")
        except OSError as err:
            logger.error("rank 0: cannot write %s (%s); on-demand requests will not find this job",
                         os.path.join(self.control_dir, JOB_FILE), err.strerror or err)
            return
        logger.info("rank 0: on-demand tracing ready: torchprof trigger --job-dir %s --iterations N "
                    "[--ranks R ...] (requests are checked about every %g s)", self.control_dir,
                    self.config.check_seconds)

    def close(self) -> None:
        """Leave: rank 0 answers queued requests and marks the job stopped; all unregister.

        Never collective and never raises: it runs on exceptions and SIGTERM too.
        """
        if not self._opened:
            return
        self._opened = False
        unregister_process(self._registered)
        self._registered = None
        undelivered, _ = self._collect_decision(timeout=5.0) or (None, 0)  # posted by every rank
        if self.rank != 0:
            return
        if undelivered is not None:
            self._inbox.answer(undelivered.request_id, {
                "status": "rejected", "reason": "the job ended before the window started"})
        try:
            self._inbox.reject_waiting()
            self._inbox.write_job_file("stopped")
        except Exception as err:  # noqa: BLE001 - leaving must not fail
            logger.warning("rank 0: could not close the on-demand control directory: %s", err)

    def window_skipped(self, window: OnDemandWindow, reason: str) -> None:
        """An accepted window will not record (skipped on every rank): rank 0 replaces its answer, so
        ``torchprof trigger --wait`` stops waiting for its traces and prints the reason.

        Args:
            window: the window that was accepted.
            reason: why it is skipped (one phrase; "ask again later" is added).
        """
        if self.rank == 0:
            logger.warning("rank 0: on-demand request %s skipped: %s; ask again later", window.request_id,
                           reason)
            self._inbox.answer(window.request_id, {
                "status": "skipped", "reason": f"{reason}; ask again later",
                "window": {"warmup_start": window.warmup_start, "start": window.start, "end": window.end,
                           "last": window.end - 1}})

    # -- the periodic check -----------------------------------------------------------------

    def start_checks(self, after: int) -> int:
        """Plan the first two checks (the same on every rank).

        Args:
            after: the iteration the checks start after.

        Returns:
            The first check iteration.
        """
        self.next_check = after + self.config.interval
        self._following_check = self.next_check + self.config.interval
        return self.next_check

    def poll(
        self, iteration: int, group: ProcessGroup | None, busy: Callable[[int], bool] | None = None
    ) -> OnDemandWindow | None:
        """Collective: every rank calls it at the same check iteration and gets the same answer.

        With a process group the decision is pipelined by one check: at check *k* rank 0 takes at most
        one request, places its window after check *k + 1*, and every rank posts an asynchronous
        broadcast of the fixed-size decision (with the iteration of check *k + 2*); at check *k + 1*
        every rank collects it (long finished by then) and adopts the same window at the same iteration,
        so no rank waits on a collective in the training thread.  Afterwards :attr:`next_check` is the
        next check iteration.  Never raises: problems are logged and the answer is "no window".

        Args:
            iteration: the check iteration (:attr:`next_check`).
            group: the fence's gloo group (None: a single process, decided at once).
            busy: whether the scheduled profiling uses an iteration (the window is moved past such
                iterations).

        Returns:
            The window every rank adopts now, or None.
        """
        self.checks += 1
        if group is None:
            window = self._decide(iteration, busy)
            self.next_check = iteration + self._pace(iteration)
            return window
        window = None
        received = self._collect_decision()  # None at the first check
        if received is not None:
            window, self._following_check = received
        if self._following_check <= iteration:  # the caller's numbering jumped: same on every rank
            self._following_check = iteration + self.config.interval
        self.next_check = self._following_check
        if not self._broken:
            decision = self._decide(self.next_check, busy)
            check_after = self.next_check + (self._pace(iteration) if self.rank == 0 else 0)
            self._post_decision(decision, check_after, group, iteration)
        return window

    def _pace(self, iteration: int) -> int:
        """Rank 0: iterations between checks so that they are ``check_seconds`` apart."""
        now = time.monotonic()
        previous, self._previous_check = self._previous_check, (iteration, now)
        if previous is None or iteration <= previous[0] or now <= previous[1]:
            return self.config.interval
        seconds_per_iteration = (now - previous[1]) / (iteration - previous[0])
        return max(self.config.interval,
                   min(int(self.config.check_seconds / seconds_per_iteration), 10_000_000))

    def _decide(self, place_after: int, busy: Callable[[int], bool] | None) -> OnDemandWindow | None:
        """Rank 0: take the next request, with its window placed after ``place_after``."""
        if self.rank != 0 or self._broken or place_after < self._busy_until:
            return None
        try:
            window = self._inbox.take_next(place_after, busy)
        except Exception as err:  # noqa: BLE001 - the training job must go on
            logger.error("rank 0: on-demand request check failed: %s: %s", type(err).__name__, err)
            return None
        if window is not None:
            self._busy_until = window.end
        return window

    def _post_decision(
        self, window: OnDemandWindow | None, check_after: int, group: ProcessGroup | None, iteration: int
    ) -> None:
        try:
            import torch
            import torch.distributed as dist

            payload = encode_decision(window, check_after, self.world_size)
            buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            with _dist.unrecorded():  # a check inside a recording window is not one of the job's collectives
                work = dist.broadcast(buffer, src=0, group=group, async_op=True)
            self._pending_decision = (work, buffer)
        except Exception as err:  # noqa: BLE001
            self._broken = True
            logger.error("rank %d: on-demand check broadcast at iteration %d failed (%s: %s); on-demand "
                         "requests are ignored from now on, training continues", self.rank, iteration,
                         type(err).__name__, err)

    def _collect_decision(self, timeout: float | None = None) -> tuple[OnDemandWindow | None, int] | None:
        """(window, check after next) posted at the previous check, or None when nothing was posted."""
        pending, self._pending_decision = self._pending_decision, None
        if pending is None:
            return None
        work, buffer = pending
        try:
            _dist.wait(work, timeout)
            return decode_decision(bytes(buffer.numpy()), self.world_size)
        except Exception as err:  # noqa: BLE001
            self._broken = True
            logger.error("rank %d: on-demand decision broadcast failed (%s: %s); on-demand requests are "
                         "ignored from now on, training continues", self.rank, type(err).__name__, err)
            return None

