"""Stacks on demand: a thread on every rank that answers ``torchprof trigger --stacks``.

The control directory (``<profile dir>/stacks``, private like on-demand tracing's)::

    stacks/job.json                        rank 0: world size, state (running / stopped)
    stacks/requests/<id>.json              written by `torchprof trigger --stacks`
    stacks/answers/<id>/stacks_rank<R>.json   every rank's answer (or rejected_rank<R>.json: why)

Each rank's thread stats ``requests/`` once a second and reads it only when it changed (or
changed lately: a change within the same clock tick as the last look is not missed); every rank
validates a new request by itself (:func:`~torchprof_args.capture.ondemand.protocol.read_stacks_request`)
and writes its own answer.  No collective, nothing asked of the training thread: it works while
that thread never returns to Python.  The same tick notices PyTorch's own flight-recorder dump
after an NCCL watchdog timeout (``tick``), so the stacks are written then too.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torchprof_args.atomic import write_json_atomically
from torchprof_args.capture.ondemand.protocol import (
    ANSWERS,
    ID_PATTERN,
    JOB_FILE,
    REQUESTS,
    RequestRejected,
    read_stacks_request,
    write_control_file,
)
from torchprof_args.capture.ondemand.registry import STACKS_REGISTRY, register_process, unregister_process
from torchprof_args.capture.stacks.dumper import StackDumper
from torchprof_args.log import get_logger
from torchprof_args.naming import stacks_file_name
from torchprof_args.private_dir import ensure_private_dir
from torchprof_args.shared import formats

__all__ = ["StacksServer"]

logger = get_logger(__name__)

#: Seconds between two looks at the control directory.
POLL_SECONDS = 1.0
#: A directory changed this recently is listed again (mtime ticks are coarser than a rename).
RECENT_SECONDS = 2.0


class StacksServer:
    """Answers stacks requests from a daemon thread (see the module docstring)."""

    def __init__(self, control_dir: str | os.PathLike[str], dumper: StackDumper, *, rank: int,
                 world_size: int, tick: Callable[[], None] | None = None) -> None:
        self.control_dir = Path(os.path.abspath(control_dir))  # the registry is read from anywhere
        self.dumper = dumper
        self.rank = rank
        self.world_size = world_size
        self.tick = tick
        self.answered = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: set[str] = set()
        self._last_mtime: int | None = None
        self._registry_entry: Path | None = None

    def start(self) -> bool:
        """Create the control directory (private), announce the job (rank 0), start the thread;
        False (logged) when the directory is unsafe or cannot be made: training goes on."""
        try:
            for path in (self.control_dir, self.control_dir / REQUESTS, self.control_dir / ANSWERS):
                ensure_private_dir(str(path), "--torch-profile-dir (stacks control directory)", OSError)
            if self.rank == 0:
                self._write_job("running")
        except OSError as err:
            logger.error("rank %d: `torchprof trigger --stacks` cannot reach this job: %s", self.rank, err)
            return False
        self._registry_entry = register_process(str(self.control_dir), self.rank, STACKS_REGISTRY)
        self._thread = threading.Thread(target=self._run, name="torchprof-stacks-server", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the thread; rank 0 marks the job stopped (a trigger then says so at once)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=2 * POLL_SECONDS)
        self.forget()
        if self.rank == 0:
            with contextlib.suppress(OSError):
                self._write_job("stopped")

    def forget(self) -> None:
        """Leave the node's registry now (the process is ending by SIGTERM); the thread answers on."""
        entry, self._registry_entry = self._registry_entry, None
        unregister_process(entry)

    def _write_job(self, state: str) -> None:
        write_control_file(self.control_dir / JOB_FILE, {
            "version": formats.ONDEMAND.version, "kind": "stacks", "world_size": self.world_size,
            "state": state, "poll_seconds": POLL_SECONDS, "pid": os.getpid()})

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.poll()
                if self.tick is not None:
                    self.tick()
            except Exception as err:  # noqa: BLE001 - this thread must outlive any one bad look
                logger.error("rank %d: stacks server: %s: %s", self.rank, type(err).__name__, err)

    def poll(self) -> int:
        """One look (one stat; a listing only when ``requests/`` changed); returns requests answered."""
        requests = self.control_dir / REQUESTS
        try:
            mtime = os.stat(requests).st_mtime_ns
        except OSError:
            return 0
        if mtime == self._last_mtime and time.time() - mtime / 1e9 > RECENT_SECONDS:
            return 0
        self._last_mtime = mtime
        names = {name[:-5] for name in os.listdir(requests)
                 if name.endswith(".json") and not name.startswith(".")}
        self._seen &= names  # withdrawn requests are forgotten
        answered = 0
        for request_id in sorted(names - self._seen):
            self._seen.add(request_id)
            self.answer(request_id)
            answered += 1
        return answered

    def answer(self, request_id: str) -> Path | None:
        """Validate one request and write this rank's answer into ``answers/<id>/``."""
        folder = self.control_dir / ANSWERS / request_id
        try:
            request = read_stacks_request(str(self.control_dir / REQUESTS / f"{request_id}.json"), request_id)
        except RequestRejected as err:
            logger.warning("rank %d: stacks request %s rejected: %s", self.rank, request_id, err)
            if ID_PATTERN.fullmatch(request_id):
                with contextlib.suppress(OSError):
                    ensure_private_dir(str(folder), "stacks answer folder", OSError)
                    write_json_atomically(folder / f"rejected_rank{self.rank}.json",
                                          {"rank": self.rank, "reason": str(err)}, private=True)
            return None
        try:
            ensure_private_dir(str(folder), "stacks answer folder", OSError)
            path = self.dumper.write(folder / stacks_file_name(self.rank),
                                     f"torchprof trigger --stacks (request {request_id})",
                                     request=request_id, native=request.native)
        except OSError as err:
            logger.error("rank %d: could not answer stacks request %s: %s", self.rank, request_id, err)
            return None
        self.answered += 1
        logger.info("rank %d: stacks written for request %s: %s", self.rank, request_id, path)
        return path

