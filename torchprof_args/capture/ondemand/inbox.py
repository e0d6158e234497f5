"""Rank 0's side of the control directory: find a request, take it once, judge it, answer it.

Taking a request is a ``rename`` from ``requests/`` into ``processed/``: atomic, so a request is
taken exactly once even if two jobs share a directory by mistake.  A check costs a ``stat`` of
``requests/`` while nothing changed; a flood of junk costs at most
:data:`MAX_ENTRIES_PER_CHECK` entries per check.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from torchprof_args.capture.ondemand.config import OnDemandConfig
from torchprof_args.capture.ondemand.protocol import (
    ANSWERS,
    ID_PATTERN,
    JOB_FILE,
    PROCESSED,
    REQUESTS,
    RequestRejected,
    read_request_file,
    write_control_file,
)
from torchprof_args.capture.ondemand.window import OnDemandWindow, place_window, ranks_text
from torchprof_args.errors import OnDemandError
from torchprof_args.log import get_logger
from torchprof_args.naming import short_hostname, trace_relpath
from torchprof_args.private_dir import ensure_private_dir
from torchprof_args.shared import formats

__all__ = ["Identity", "Inbox"]

logger = get_logger(__name__)

#: Entries rank 0 looks at per check, so a flood of junk cannot stall a step for long.
MAX_ENTRIES_PER_CHECK = 8
#: Rank 0 rescans ``requests/`` at least this often even when its mtime did not change.
FULL_SCAN_SECONDS = 60.0
#: An unchanged directory mtime is trusted only when older than this (1 s timestamps on some
#: network filesystems: a request written in the same tick as the last scan would go unseen).
MTIME_SETTLE_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class Identity:
    """What rank 0 needs from every rank to name its trace files."""

    host: str
    pid: int
    trace_dir: str


class Inbox:
    """The control directory as rank 0 sees it (used on rank 0 only)."""

    def __init__(self, config: OnDemandConfig, *, world_size: int) -> None:
        self.config = config
        self.world_size = world_size
        self.control_dir = os.path.abspath(config.control_dir)
        self.trace_dir = os.path.abspath(config.trace_dir)
        self.requests_dir = os.path.join(self.control_dir, REQUESTS)
        self.processed_dir = os.path.join(self.control_dir, PROCESSED)
        self.answers_dir = os.path.join(self.control_dir, ANSWERS)
        #: Every rank's identity, by rank (gathered by the controller's set-up).
        self.identities: list[Identity] = []
        self._seen_mtime_ns: int | None = None
        self._last_full_scan = 0.0
        self._backlog = False
        self._rejected_count = 0

    def prepare(self) -> None:
        """Create the control directory and its subdirectories (0700); raise OnDemandError if unsafe."""
        for path in (self.control_dir, self.requests_dir, self.processed_dir, self.answers_dir):
            ensure_private_dir(path, "--torch-profile-on-demand-dir", OnDemandError)

    def write_job_file(self, state: str) -> None:
        write_control_file(os.path.join(self.control_dir, JOB_FILE), {
            "version": formats.ONDEMAND.version,
            "state": state,
            "world_size": self.world_size,
            "check_seconds": self.config.check_seconds,
            "min_check_interval": self.config.interval,
            "max_iterations": self.config.max_iterations,
            "warmup": self.config.warmup,
            "trace_dir": self.trace_dir,
            "host": short_hostname(),
            "pid": os.getpid(),
            "updated": time.time(),
        })

    def reject_waiting(self, limit: int = 100) -> None:
        """The job is ending: answer every request still waiting (up to ``limit``) with a rejection."""
        with os.scandir(self.requests_dir) as entries:
            names = sorted(e.name for e in entries if not e.name.startswith("."))
        for name in names[:limit]:
            self._take(name, iteration=None, busy=None)

    def _requests_changed(self) -> tuple[bool, int]:
        mtime = os.stat(self.requests_dir).st_mtime_ns
        unchanged = (mtime == self._seen_mtime_ns and not self._backlog
                     and time.monotonic() - self._last_full_scan < FULL_SCAN_SECONDS)
        return not unchanged, mtime

    def take_next(self, iteration: int, busy: Callable[[int], bool] | None) -> OnDemandWindow | None:
        """The window of the first valid request waiting, placed after ``iteration`` (or None)."""
        changed, mtime = self._requests_changed()
        if not changed:
            return None
        with os.scandir(self.requests_dir) as entries:
            names = sorted(e.name for e in entries if not e.name.startswith("."))
        self._last_full_scan = time.monotonic()
        settled = time.time() - mtime / 1e9 > MTIME_SETTLE_SECONDS
        self._seen_mtime_ns = mtime if settled else None
        self._backlog = False
        for index, name in enumerate(names):
            if index >= MAX_ENTRIES_PER_CHECK:
                self._backlog = True
                break
            window = self._take(name, iteration, busy)
            if window is not None:
                self._backlog = index + 1 < len(names)
                return window
        return None

    def _take(
        self, name: str, iteration: int | None, busy: Callable[[int], bool] | None
    ) -> OnDemandWindow | None:
        """Consume one entry of ``requests/``: rename it into ``processed/``, then judge it.

        ``iteration`` None means the job is ending: valid requests are answered "rejected".
        """
        request_id = name[:-5] if name.endswith(".json") else ""
        safe_name = bool(ID_PATTERN.fullmatch(request_id))
        if safe_name:
            target = os.path.join(self.processed_dir, name)
        else:
            self._rejected_count += 1
            target = os.path.join(self.processed_dir, f"invalid-name-{time.time_ns()}-{self._rejected_count}")
        try:
            os.rename(os.path.join(self.requests_dir, name), target)
        except FileNotFoundError:
            return None  # withdrawn by the trigger, or taken by an earlier check
        if not safe_name:
            logger.warning("rank 0: ignored an on-demand request with an invalid file name %r (moved to %s); "
                           "names are '<id>.json' with letters, digits, '.', '_' and '-'", name[:120], target)
            return None
        try:
            request = read_request_file(target, request_id, world_size=self.world_size,
                                        max_iterations=self.config.max_iterations)
            if iteration is None:
                raise RequestRejected("the job ended before the request was taken")
            window = place_window(request, iteration, self.config.warmup, busy)
        except RequestRejected as err:
            logger.warning("rank 0: on-demand request %s rejected: %s", request_id, err)
            self.answer(request_id, {"status": "rejected", "reason": str(err)})
            return None
        traces = {str(r): self.trace_path(r, window) for r in self._traced_ranks(window)}
        message = (f"ranks {ranks_text(window.ranks)} trace global iterations "
                   f"{window.start}..{window.end - 1} (checked at iteration {iteration}, "
                   f"{window.start - window.warmup_start} warmup step(s))")
        if window.warmup_start > iteration + 1:
            message += ("; moved to start after the scheduled profiling at iteration "
                        f"{window.warmup_start - 1}")
        logger.info("rank 0: on-demand request %s accepted: %s", request_id, message)
        self.answer(request_id, {
            "status": "accepted",
            "message": message,
            "check_iteration": iteration,
            "window": {"warmup_start": window.warmup_start, "start": window.start, "end": window.end,
                       "last": window.end - 1},
            "ranks": sorted(int(r) for r in traces),
            "traces": traces,
        })
        return window

    def _traced_ranks(self, window: OnDemandWindow) -> list[int]:
        return list(range(self.world_size)) if window.ranks is None else list(window.ranks)

    def trace_path(self, rank: int, window: OnDemandWindow) -> str:
        """Where ``rank``'s trace of ``window`` will be published (``naming.trace_relpath``: the
        window's cycle folder under the rank's profile directory)."""
        who = (self.identities[rank] if rank < len(self.identities)
               else Identity(short_hostname(), 0, self.trace_dir))
        relpath = trace_relpath(rank, window.start, window.end - 1, gzip=self.config.gzip,
                                host=who.host, pid=who.pid)
        return os.path.join(who.trace_dir, relpath)

    def answer(self, request_id: str, payload: dict[str, Any]) -> None:
        try:
            write_control_file(
                os.path.join(self.answers_dir, f"{request_id}.json"),
                {"version": formats.ONDEMAND.version, "id": request_id, "answered": time.time(), **payload},
            )
        except OSError as err:
            logger.error("rank 0: cannot write the answer to on-demand request %s: %s", request_id,
                         err.strerror or err)


