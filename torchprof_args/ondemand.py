"""On-demand tracing: a running job traces a few iterations when ``torchprof trigger`` asks.

No daemon: requests travel through a **control directory** on a filesystem that rank 0 and the
person triggering can both reach (the shared filesystem of a SLURM job, or a local disk)::

    CONTROL_DIR/                 # default <profile dir>/ondemand, mode 0700, owned by the job's user
      job.json                   # written by rank 0: world size, check interval, limits, state
      requests/<id>.json         # written by `torchprof trigger` (hidden temp name, then rename)
      processed/<id>.json        # rank 0 renames a request here to take it: atomic, taken once
      answers/<id>.json          # rank 0's answer: accepted window and trace paths, or the reason

At check iterations every rank calls :meth:`OnDemandController.poll`: rank 0 looks for a
request (a ``stat`` of ``requests/``, a ``scandir`` only when it changed), validates it, writes
the answer, and every rank posts an *asynchronous* broadcast of the fixed-size decision on the
profiler's gloo group, collected at the next check.  The decision also says when the check after
next happens: rank 0 spaces checks about ``--torch-profile-on-demand-check-seconds`` apart from the
measured step time (never closer than ``--torch-profile-on-demand-interval`` iterations), so a
check costs next to nothing per step whatever the step time, and a request is taken within about
two check periods.  All ranks agree on the window ``[start, end)`` of global iterations, and its
flush is fenced exactly like a scheduled one.

Safety: the control directory must belong to the job's user and not be group- or world-writable;
requests must be regular files (no symlinks) of that user, small, JSON with known fields only and
bounded values.  Anything else is rejected with a logged reason (and an answer saying why) and
never stops the job.

:func:`register_process` / :func:`find_control_dir_by_pid` keep a per-user registry on each
node (``/tmp/torchprof-<uid>/ondemand-jobs/<pid>.json``, or ``$TORCHPROF_RUNTIME_DIR``) so that
``torchprof trigger --pid PID`` finds the control directory of a rank or of its launcher.

Import-light: torch is imported only inside the collective methods.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets
import stat
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchprof_args.atomic import atomic_output
from torchprof_args.flags import TorchProfileArgsError, resolve_profile_dir
from torchprof_args.log import get_logger
from torchprof_args.schedule import Action
from torchprof_args.trace_writer import GZIP_SUFFIX, TRACE_SUFFIX, short_hostname, trace_stem

__all__ = [
    "OnDemandController",
    "OnDemandError",
    "OnDemandWindow",
    "RequestRejected",
    "check_kineto_daemon_env",
    "check_private_dir",
    "find_control_dir_by_pid",
    "parse_request",
    "registered_processes",
    "resolve_control_dir",
]

logger = get_logger("torchprof_args.ondemand")

PROTOCOL_VERSION = 1
CONTROL_SUBDIR = "ondemand"
JOB_FILE = "job.json"
REQUESTS, PROCESSED, ANSWERS = "requests", "processed", "answers"
#: Request files larger than this are rejected unread.
MAX_REQUEST_BYTES = 4096
#: Entries rank 0 looks at per check, so a flood of junk cannot stall a step for long.
MAX_ENTRIES_PER_CHECK = 8
#: An accepted window may be pushed back past a scheduled cycle by at most this many iterations.
MAX_DEFER_ITERATIONS = 10_000
#: Rank 0 rescans ``requests/`` at least this often even when its mtime did not change.
FULL_SCAN_SECONDS = 60.0
#: An unchanged directory mtime is trusted only when older than this (1 s timestamps on some
#: network filesystems: a request written in the same tick as the last scan would go unseen).
MTIME_SETTLE_SECONDS = 2.0
REQUEST_FIELDS = frozenset({"version", "id", "iterations", "ranks", "requested_by", "created"})
REQUESTED_BY_FIELDS = frozenset({"host", "pid", "uid"})
_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_RUNTIME_ENV = "TORCHPROF_RUNTIME_DIR"


class OnDemandError(TorchProfileArgsError):
    """The on-demand control directory or registry cannot be used safely."""


class RequestRejected(ValueError):
    """A trace request that is not valid; the message is the reason given in the answer."""


# ---------------------------------------------------------------------------------------------
# Small filesystem helpers shared by the job and ``torchprof trigger``.


def default_control_dir(profile_dir: str) -> str:
    """Where the control directory goes unless ``--torch-profile-on-demand-dir`` says otherwise."""
    return os.path.join(profile_dir, CONTROL_SUBDIR)


def check_private_dir(path: str | os.PathLike[str], flag: str = "--torch-profile-on-demand-dir") -> str | None:
    """Why ``path`` is not a safe control directory (a sentence), or None when it is.

    Safe: a real directory (not a symlink), owned by the current user, not group- or
    world-writable, so nobody else can plant or swap requests.
    """
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"{flag} {str(path)!r} cannot be read ({err.strerror or err})."
    if stat.S_ISLNK(info.st_mode):
        return f"{flag} {str(path)!r} is a symbolic link; give the real directory."
    if not stat.S_ISDIR(info.st_mode):
        return f"{flag} {str(path)!r} is not a directory."
    if info.st_uid != os.getuid():
        return (f"{flag} {str(path)!r} is owned by uid {info.st_uid}, not by you (uid {os.getuid()}): "
                "others could forge or read trace requests. Choose a directory of your own.")
    if info.st_mode & 0o022:
        return (f"{flag} {str(path)!r} is group- or world-writable (mode {stat.S_IMODE(info.st_mode):o}): "
                f"others could forge trace requests. Run 'chmod 700 {path}' or choose another directory.")
    return None


def _ensure_private_dir(path: str, flag: str) -> None:
    """Create ``path`` (mode 0700) if missing, then require it to be private; raises OnDemandError."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise OnDemandError(f"{flag} {path!r} cannot be created ({err.strerror or err}); "
                            "choose a directory you can write to.") from None
    problem = check_private_dir(path, flag)
    if problem:
        raise OnDemandError(problem)


def write_json_atomically(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON under a hidden temporary name (mode 0600), then rename it into place."""
    with atomic_output(path, "w", private=True) as handle:
        json.dump(payload, handle, indent=1, sort_keys=True)
        handle.write("\n")


def read_small_json(path: str | os.PathLike[str], limit: int = 1 << 20) -> Any:
    """Parse a JSON file of at most ``limit`` bytes, refusing symlinks; raises OSError/ValueError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return json.loads(data)


def resolve_control_dir(job_dir: str | os.PathLike[str]) -> Path:
    """The control directory for ``torchprof trigger --job-dir``: the directory itself when it holds
    ``job.json``, else its ``ondemand/`` subdirectory (``--job-dir`` may be the profile directory)."""
    job_dir = Path(job_dir)
    for candidate in (job_dir, job_dir / CONTROL_SUBDIR):
        if (candidate / JOB_FILE).is_file():
            return candidate
    raise FileNotFoundError(
        f"--job-dir {str(job_dir)!r}: no {JOB_FILE} there or in {CONTROL_SUBDIR}/; give the job's "
        "--torch-profile-on-demand-dir (or its --torch-profile-dir), and check the job runs with "
        "--torch-profile-on-demand and has started its training loop."
    )


def new_request_id() -> str:
    """A unique request id that sorts by creation time: ``20250101T120000-node1-4242-1a2b3c``."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", short_hostname())[:40] or "host"
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{host}-{os.getpid()}-{secrets.token_hex(3)}"


# ---------------------------------------------------------------------------------------------
# Requests.


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """A validated request: trace ``iterations`` iterations on ``ranks`` (None = all ranks)."""

    request_id: str
    iterations: int
    ranks: tuple[int, ...] | None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_request(data: bytes, *, request_id: str, world_size: int, max_iterations: int) -> TraceRequest:
    """Validate the bytes of one request file; raises :class:`RequestRejected` with the reason."""
    if len(data) > MAX_REQUEST_BYTES:
        raise RequestRejected(f"the request file is larger than {MAX_REQUEST_BYTES} bytes")
    try:
        payload = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestRejected(f"the request is not valid JSON ({err})") from None
    if not isinstance(payload, dict):
        raise RequestRejected("the request must be a JSON object")
    unknown = sorted(set(payload) - REQUEST_FIELDS)
    if unknown:
        raise RequestRejected(f"unknown field(s) {', '.join(map(repr, unknown))[:200]}; known fields are "
                              f"{', '.join(sorted(REQUEST_FIELDS))}")
    if payload.get("version", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise RequestRejected(f"protocol version {payload.get('version')!r} is not supported "
                              f"(this job speaks version {PROTOCOL_VERSION}); use the same torchprof-args")
    if "id" in payload and payload["id"] != request_id:
        raise RequestRejected("the id field does not match the file name")
    iterations = payload.get("iterations")
    if not _is_int(iterations) or not 1 <= iterations <= max_iterations:
        raise RequestRejected(f"iterations must be a whole number from 1 to {max_iterations} "
                              f"(--torch-profile-on-demand-max-iterations), got {iterations!r}")
    ranks = payload.get("ranks", [0])
    if ranks == "all":
        ranks_tuple = None
    else:
        if not isinstance(ranks, list) or not ranks or not all(_is_int(r) for r in ranks):
            raise RequestRejected(f"ranks must be 'all' or a non-empty list of global ranks, got {ranks!r}"[:300])
        outside = sorted({r for r in ranks if not 0 <= r < world_size})
        if outside:
            raise RequestRejected(f"rank(s) {' '.join(map(str, outside[:10]))} outside the world size "
                                  f"{world_size} (valid ranks are 0..{world_size - 1})")
        ranks_tuple = tuple(sorted(set(ranks)))
    requested_by = payload.get("requested_by", {})
    if not isinstance(requested_by, dict) or set(requested_by) - REQUESTED_BY_FIELDS or not all(
        isinstance(v, (str, int)) and len(str(v)) <= 100 for v in requested_by.values()
    ):
        raise RequestRejected(f"requested_by must be an object with fields {', '.join(sorted(REQUESTED_BY_FIELDS))}")
    if "created" in payload and not isinstance(payload["created"], (int, float)):
        raise RequestRejected("created must be a number (seconds since the epoch)")
    return TraceRequest(request_id, iterations, ranks_tuple)


def make_request(iterations: int, ranks: list[int] | str, request_id: str | None = None) -> dict[str, Any]:
    """The JSON payload ``torchprof trigger`` writes."""
    return {
        "version": PROTOCOL_VERSION,
        "id": request_id or new_request_id(),
        "iterations": iterations,
        "ranks": ranks,
        "requested_by": {"host": short_hostname(), "pid": os.getpid(), "uid": os.getuid()},
        "created": time.time(),
    }


# ---------------------------------------------------------------------------------------------
# The window all ranks agree on.


@dataclasses.dataclass(frozen=True)
class OnDemandWindow:
    """An accepted request: warm up from ``warmup_start``, record global iterations ``[start, end)``."""

    request_id: str
    check_iteration: int
    warmup_start: int
    start: int
    end: int
    ranks: tuple[int, ...] | None  # None: every rank

    def traces(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def action(self, iteration: int) -> Action:
        """This window's profiler action for ``iteration`` (the same on every rank)."""
        if self.start <= iteration < self.end:
            return Action.RECORD_AND_SAVE if iteration == self.end - 1 else Action.RECORD
        if self.warmup_start <= iteration < self.start:
            return Action.WARMUP
        return Action.NONE

    def as_tuple(self) -> tuple[Any, ...]:
        return dataclasses.astuple(self)


# ---------------------------------------------------------------------------------------------
# The controller (inside the training job).


@dataclasses.dataclass(frozen=True)
class _Identity:
    """What rank 0 needs from every rank to name its trace files."""

    host: str
    pid: int
    trace_dir: str


class OnDemandController:
    """Takes trace requests from the control directory and agrees on windows across ranks.

    Lifecycle: :meth:`setup` (collective, at construction), :meth:`open` (advertise the job),
    :meth:`poll` at every check iteration (collective), :meth:`close` (never collective).
    """

    def __init__(
        self,
        control_dir: str,
        *,
        rank: int,
        world_size: int,
        trace_dir: str,
        interval: int = 10,
        check_seconds: float = 10.0,
        max_iterations: int = 20,
        warmup: int = 1,
        gzip: bool = True,
    ) -> None:
        self.control_dir = os.path.abspath(control_dir)
        self.rank = rank
        self.world_size = world_size
        self.trace_dir = os.path.abspath(trace_dir)
        self.interval = interval
        self.check_seconds = check_seconds
        self.max_iterations = max_iterations
        self.warmup = warmup
        self.trace_suffix = TRACE_SUFFIX + (GZIP_SUFFIX if gzip else "")
        self.requests_dir = os.path.join(self.control_dir, REQUESTS)
        self.processed_dir = os.path.join(self.control_dir, PROCESSED)
        self.answers_dir = os.path.join(self.control_dir, ANSWERS)
        self._identities: list[_Identity] = []
        self._seen_mtime_ns: int | None = None
        self._last_full_scan = 0.0
        self._backlog = False
        self._broken = False
        #: (work, buffer) of the decision broadcast posted at the last check, collected at the next.
        self._pending_decision: tuple[Any, Any] | None = None
        #: The next check iteration (all ranks agree) and the one after it (pipelined decisions).
        self.next_check = interval
        self._following_check = 2 * interval
        #: Rank 0: (iteration, monotonic time) of the previous check, to measure the step time.
        self._previous_check: tuple[int, float] | None = None
        #: Rank 0: the end of the last window it decided; no new request is taken before it.
        self._busy_until = 0
        self._opened = False
        self._registered: Path | None = None
        self._rejected_count = 0
        self.checks = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, rank: int, world_size: int) -> OnDemandController:
        """Build from validated flags (``--torch-profile-on-demand*`` plus the profile dir and gzip)."""
        profile_dir = resolve_profile_dir(args)
        return cls(
            getattr(args, "torch_profile_on_demand_dir", None) or default_control_dir(profile_dir),
            rank=rank,
            world_size=world_size,
            trace_dir=profile_dir,
            interval=args.torch_profile_on_demand_interval,
            check_seconds=args.torch_profile_on_demand_check_seconds,
            max_iterations=args.torch_profile_on_demand_max_iterations,
            warmup=args.torch_profile_warmup if args.torch_profile_warmup is not None else 1,
            gzip=bool(getattr(args, "torch_profile_gzip", True)),
        )

    # -- set-up and tear-down ---------------------------------------------------------------

    def setup(self, group: Any) -> None:
        """Collective: rank 0 prepares the control directory; all ranks raise if it is unsafe.

        Also gathers every rank's host, pid and trace directory on rank 0 (trace file names).
        """
        if self.world_size > 1 and group is None:
            raise OnDemandError(
                f"--torch-profile-on-demand with WORLD_SIZE {self.world_size} needs torch.distributed "
                "initialised before TorchProfiler.from_args, so that ranks can agree on trace windows."
            )
        problem = None
        if self.rank == 0:
            try:
                _ensure_private_dir(self.control_dir, "--torch-profile-on-demand-dir")
                for sub in (self.requests_dir, self.processed_dir, self.answers_dir):
                    _ensure_private_dir(sub, "--torch-profile-on-demand-dir")
            except OnDemandError as err:
                problem = str(err)
        identity = _Identity(short_hostname(), os.getpid(), self.trace_dir)
        if group is None:
            self._identities = [identity]
        else:
            import torch.distributed as dist

            message = [problem]
            dist.broadcast_object_list(message, src=0, group=group)
            problem = message[0]
            gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object(identity, gathered, dst=0, group=group)
            self._identities = list(gathered or [])
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
            self._write_job_file("running")
        except OSError as err:
            logger.error("rank 0: cannot write %s (%s); on-demand requests will not find this job",
                         os.path.join(self.control_dir, JOB_FILE), err.strerror or err)
            return
        logger.info("rank 0: on-demand tracing ready: torchprof trigger --job-dir %s --iterations N "
                    "[--ranks R ...] (requests are checked about every %g s)",
                    self.control_dir, self.check_seconds)

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
            self._answer(undelivered.request_id, {
                "status": "rejected", "reason": "the job ended before the window started"})
        try:
            with os.scandir(self.requests_dir) as entries:
                names = sorted(e.name for e in entries if not e.name.startswith("."))
            for name in names[:100]:
                self._take(name, iteration=None, busy=None)
            self._write_job_file("stopped")
        except Exception as err:  # noqa: BLE001 - leaving must not fail
            logger.warning("rank 0: could not close the on-demand control directory: %s", err)

    def _write_job_file(self, state: str) -> None:
        write_json_atomically(os.path.join(self.control_dir, JOB_FILE), {
            "version": PROTOCOL_VERSION,
            "state": state,
            "world_size": self.world_size,
            "check_seconds": self.check_seconds,
            "min_check_interval": self.interval,
            "max_iterations": self.max_iterations,
            "warmup": self.warmup,
            "trace_dir": self.trace_dir,
            "host": short_hostname(),
            "pid": os.getpid(),
            "updated": time.time(),
        })

    # -- the periodic check -----------------------------------------------------------------

    def start_checks(self, after: int) -> int:
        """Plan the first two checks after iteration ``after`` (same on every rank); returns the first."""
        self.next_check = after + self.interval
        self._following_check = self.next_check + self.interval
        return self.next_check

    def poll(self, iteration: int, group: Any, busy: Callable[[int], bool] | None = None) -> OnDemandWindow | None:
        """Collective: every rank calls it at the same check iteration and gets the same answer.

        With a process group the decision is pipelined by one check: at check *k* rank 0 takes at
        most one request, places its window after check *k + 1*, and every rank posts an
        asynchronous broadcast of the fixed-size decision (with the iteration of check *k + 2*);
        at check *k + 1* every rank collects it (long finished by then) and adopts the same window
        at the same iteration, so no rank waits on a collective in the training thread.
        ``busy(i)`` says whether the scheduled profiling uses iteration ``i`` (the window is moved
        past such iterations).  Afterwards :attr:`next_check` is the next check iteration.  Never
        raises: problems are logged and the answer is "no window".
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
            self._following_check = iteration + self.interval
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
            return self.interval
        seconds_per_iteration = (now - previous[1]) / (iteration - previous[0])
        return max(self.interval, min(int(self.check_seconds / seconds_per_iteration), 10_000_000))

    def _decide(self, place_after: int, busy: Callable[[int], bool] | None) -> OnDemandWindow | None:
        """Rank 0: take the next request, with its window placed after ``place_after``."""
        if self.rank != 0 or self._broken or place_after < self._busy_until:
            return None
        try:
            window = self._take_next(place_after, busy)
        except Exception as err:  # noqa: BLE001 - the training job must go on
            logger.error("rank 0: on-demand request check failed: %s: %s", type(err).__name__, err)
            return None
        if window is not None:
            self._busy_until = window.end
        return window

    def _post_decision(self, window: OnDemandWindow | None, check_after: int, group: Any, iteration: int) -> None:
        try:
            import torch
            import torch.distributed as dist

            payload = _encode_decision(window, check_after, self.world_size)
            buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
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
            if timeout is None:
                work.wait()
            else:
                import datetime

                work.wait(datetime.timedelta(seconds=timeout))
            return _decode_decision(bytes(buffer.numpy()), self.world_size)
        except Exception as err:  # noqa: BLE001
            self._broken = True
            logger.error("rank %d: on-demand decision broadcast failed (%s: %s); on-demand requests are "
                         "ignored from now on, training continues", self.rank, type(err).__name__, err)
            return None

    def _requests_changed(self) -> tuple[bool, int]:
        mtime = os.stat(self.requests_dir).st_mtime_ns
        unchanged = (mtime == self._seen_mtime_ns and not self._backlog
                     and time.monotonic() - self._last_full_scan < FULL_SCAN_SECONDS)
        return not unchanged, mtime

    def _take_next(self, iteration: int, busy: Callable[[int], bool] | None) -> OnDemandWindow | None:
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

    def _take(self, name: str, iteration: int | None, busy: Callable[[int], bool] | None) -> OnDemandWindow | None:
        """Consume one entry of ``requests/``: rename it into ``processed/``, then judge it.

        ``iteration`` None means the job is ending: valid requests are answered "rejected".
        """
        request_id = name[:-5] if name.endswith(".json") else ""
        safe_name = bool(_ID_PATTERN.fullmatch(request_id))
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
            request = self._read_request(target, request_id)
            if iteration is None:
                raise RequestRejected("the job ended before the request was taken")
            window = self._place(request, iteration, busy)
        except RequestRejected as err:
            logger.warning("rank 0: on-demand request %s rejected: %s", request_id, err)
            self._answer(request_id, {"status": "rejected", "reason": str(err)})
            return None
        traces = {str(r): self.trace_path(r, window) for r in self._traced_ranks(window)}
        message = (f"ranks {_ranks_text(window.ranks)} trace global iterations {window.start}..{window.end - 1} "
                   f"(checked at iteration {iteration}, {window.start - window.warmup_start} warmup step(s))")
        if window.warmup_start > iteration + 1:
            message += f"; moved to start after the scheduled profiling at iteration {window.warmup_start - 1}"
        logger.info("rank 0: on-demand request %s accepted: %s", request_id, message)
        self._answer(request_id, {
            "status": "accepted",
            "message": message,
            "check_iteration": iteration,
            "window": {"warmup_start": window.warmup_start, "start": window.start, "end": window.end,
                       "last": window.end - 1},
            "ranks": sorted(int(r) for r in traces),
            "traces": traces,
        })
        return window

    def _read_request(self, path: str, request_id: str) -> TraceRequest:
        try:
            info = os.lstat(path)
        except OSError as err:
            raise RequestRejected(f"the request cannot be read ({err.strerror or err})") from None
        if stat.S_ISLNK(info.st_mode):
            raise RequestRejected("the request is a symbolic link; write a regular file")
        if not stat.S_ISREG(info.st_mode):
            raise RequestRejected("the request is not a regular file")
        if info.st_uid != os.getuid():
            raise RequestRejected(f"the request is owned by uid {info.st_uid}, but the job runs as uid "
                                  f"{os.getuid()}; only the job's user may request traces")
        if info.st_size > MAX_REQUEST_BYTES:
            raise RequestRejected(f"the request file is larger than {MAX_REQUEST_BYTES} bytes")
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise RequestRejected("the request is a symbolic link; write a regular file") from None
            raise RequestRejected(f"the request cannot be opened ({err.strerror or err})") from None
        with os.fdopen(fd, "rb") as handle:
            opened = os.fstat(handle.fileno())
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                raise RequestRejected("the request was replaced while being read")
            data = handle.read(MAX_REQUEST_BYTES + 1)
        return parse_request(data, request_id=request_id, world_size=self.world_size,
                             max_iterations=self.max_iterations)

    def _place(self, request: TraceRequest, iteration: int, busy: Callable[[int], bool] | None) -> OnDemandWindow:
        """The window for ``request`` checked at ``iteration``: the earliest that avoids scheduled work."""
        length = self.warmup + request.iterations
        warmup_start = iteration + 1
        limit = iteration + 1 + MAX_DEFER_ITERATIONS
        while busy is not None:
            clash = next((i for i in range(warmup_start, warmup_start + length) if busy(i)), None)
            if clash is None:
                break
            while busy(clash) and clash <= limit:
                clash += 1
            warmup_start = clash
            if warmup_start > limit:
                raise RequestRejected(
                    f"the scheduled --torch-profile cycles leave no gap of {length} iterations in the next "
                    f"{MAX_DEFER_ITERATIONS}; ask for fewer iterations or retry later")
        start = warmup_start + self.warmup
        return OnDemandWindow(request.request_id, iteration, warmup_start, start, start + request.iterations,
                              request.ranks)

    def _traced_ranks(self, window: OnDemandWindow) -> list[int]:
        return list(range(self.world_size)) if window.ranks is None else list(window.ranks)

    def trace_path(self, rank: int, window: OnDemandWindow) -> str:
        """Where ``rank``'s trace of ``window`` will be published (the core's ``trace_stem``)."""
        who = self._identities[rank] if rank < len(self._identities) else _Identity(short_hostname(), 0, self.trace_dir)
        stem = trace_stem(rank, window.start, window.end - 1, host=who.host, pid=who.pid)
        return os.path.join(who.trace_dir, stem + self.trace_suffix)

    def _answer(self, request_id: str, payload: dict[str, Any]) -> None:
        try:
            write_json_atomically(os.path.join(self.answers_dir, f"{request_id}.json"),
                                  {"version": PROTOCOL_VERSION, "id": request_id, "answered": time.time(),
                                   **payload})
        except OSError as err:
            logger.error("rank 0: cannot write the answer to on-demand request %s: %s", request_id,
                         err.strerror or err)


#: has window, check after next, the window's check iteration, warmup start, start, end, all ranks
_DECISION_HEADER = struct.Struct("<7q")
_ID_BYTES = 100  # request ids are at most 100 characters (_ID_PATTERN)


def _decision_size(world_size: int) -> int:
    return _DECISION_HEADER.size + _ID_BYTES + world_size


def _encode_decision(window: OnDemandWindow | None, check_after: int, world_size: int) -> bytes:
    """A fixed-size encoding of a check's decision, so it travels in one asynchronous broadcast."""
    payload = bytearray(_decision_size(world_size))
    if window is None:
        _DECISION_HEADER.pack_into(payload, 0, 0, check_after, 0, 0, 0, 0, 0)
        return bytes(payload)
    _DECISION_HEADER.pack_into(payload, 0, 1, check_after, window.check_iteration, window.warmup_start,
                               window.start, window.end, int(window.ranks is None))
    request_id = window.request_id.encode()[:_ID_BYTES]
    payload[_DECISION_HEADER.size:_DECISION_HEADER.size + len(request_id)] = request_id
    for rank in window.ranks or ():
        payload[_DECISION_HEADER.size + _ID_BYTES + rank] = 1
    return bytes(payload)


def _decode_decision(payload: bytes, world_size: int) -> tuple[OnDemandWindow | None, int]:
    has_window, check_after, check, warmup_start, start, end, all_ranks = _DECISION_HEADER.unpack_from(payload, 0)
    if not has_window:
        return None, check_after
    request_id = payload[_DECISION_HEADER.size:_DECISION_HEADER.size + _ID_BYTES].rstrip(b"\0").decode()
    mask = payload[_DECISION_HEADER.size + _ID_BYTES:]
    ranks = None if all_ranks else tuple(rank for rank in range(world_size) if mask[rank])
    return OnDemandWindow(request_id, check, warmup_start, start, end, ranks), check_after


def _ranks_text(ranks: tuple[int, ...] | None) -> str:
    return "all" if ranks is None else " ".join(map(str, ranks))


# ---------------------------------------------------------------------------------------------
# The per-node registry: pid -> control directory, for ``torchprof trigger --pid``.


def registry_dir() -> Path:
    """``$TORCHPROF_RUNTIME_DIR/ondemand-jobs``, else ``/tmp/torchprof-<uid>/ondemand-jobs``.

    A fixed path rather than ``$TMPDIR``: schedulers give each job its own ``TMPDIR``, and the
    trigger runs outside the job.
    """
    base = os.environ.get(_RUNTIME_ENV) or os.path.join("/tmp", f"torchprof-{os.getuid()}")
    return Path(base) / "ondemand-jobs"


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (field 3 onwards), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _start_ticks(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _parent(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def _alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    current = _start_ticks(pid)
    return start_ticks is None or current is None or current == start_ticks


def register_process(control_dir: str, rank: int) -> Path | None:
    """Record this process in the node's registry; returns the entry (None if it could not be written)."""
    directory = registry_dir()
    try:
        os.makedirs(directory.parent, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        # Our own per-user directories may have been created group-writable under a umask of
        # 002 (the staging directory shares /tmp/torchprof-<uid>): tighten them, never others'.
        own = [directory] if os.environ.get(_RUNTIME_ENV) else [directory.parent, directory]
        for path in own:
            info = os.lstat(path)
            if info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode) and info.st_mode & 0o022:
                os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o022)
        problem = next(filter(None, (check_private_dir(path, "registry") for path in own)), None)
        if problem:
            raise OSError(problem)
        entry = directory / f"{os.getpid()}.json"
        write_json_atomically(entry, {"pid": os.getpid(), "rank": rank, "control_dir": control_dir,
                                      "host": short_hostname(), "start_ticks": _start_ticks(os.getpid()),
                                      "registered": time.time()})
        return entry
    except OSError as err:
        logger.warning("rank %d: could not register for 'torchprof trigger --pid' in %s (%s); use "
                       "'torchprof trigger --job-dir %s' instead", rank, directory, err, control_dir)
        return None


def unregister_process(entry: Path | None) -> None:
    if entry is not None:
        with contextlib.suppress(OSError):
            entry.unlink()


def registered_processes() -> dict[int, dict[str, Any]]:
    """Live registry entries of this user on this node, by pid; stale entries are removed."""
    directory = registry_dir()
    found: dict[int, dict[str, Any]] = {}
    if check_private_dir(directory, "registry"):
        return found
    for path in directory.glob("*.json"):
        try:
            entry = read_small_json(path, limit=MAX_REQUEST_BYTES)
            pid = int(entry["pid"])
            if os.lstat(path).st_uid != os.getuid() or path.stem != str(pid):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid, entry.get("start_ticks")):
            found[pid] = entry
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def find_control_dir_by_pid(pid: int) -> Path:
    """The control directory of the job that ``pid`` is a rank of, or an ancestor of (torchrun, srun).

    Raises LookupError with a sentence that says what to do.
    """
    entries = registered_processes()
    if pid in entries:
        return Path(entries[pid]["control_dir"])
    matches: set[str] = set()
    for child, entry in entries.items():
        ancestor, hops = _parent(child), 0
        while ancestor and ancestor > 1 and hops < 64:
            if ancestor == pid:
                matches.add(entry["control_dir"])
                break
            ancestor, hops = _parent(ancestor), hops + 1
    if len(matches) == 1:
        return Path(matches.pop())
    if matches:
        raise LookupError(f"--pid {pid}: several on-demand jobs run under it ({', '.join(sorted(matches))}); "
                          "pick one with --job-dir")
    raise LookupError(
        f"--pid {pid}: no job started with --torch-profile-on-demand is that process or runs under it "
        f"on this node (registry {registry_dir()}); check the pid and the user, or use --job-dir "
        "(needed from another node)."
    )


# ---------------------------------------------------------------------------------------------
# dynolog: KINETO_USE_DAEMON must be set before torch is imported.

_kineto_warned = False


def kineto_daemon_env_too_late() -> bool:
    """True when ``KINETO_USE_DAEMON`` is set now but torch was imported before it was set.

    Observed from what torch's import did: ``torch.profiler`` installs its optimizer-step hook
    (which dynolog's iteration-based traces need) only if the variable was set at import time.
    Falls back to what :mod:`torchprof_args` saw at its own import.
    """
    if not os.environ.get("KINETO_USE_DAEMON") or "torch" not in sys.modules:
        return False
    try:
        import torch.optim.optimizer as optimizer_module
        import torch.profiler as torch_profiler

        hook = torch_profiler._optimizer_post_hook  # noqa: SLF001
        hooks = optimizer_module._global_optimizer_post_hooks  # noqa: SLF001
        return hook not in hooks.values()
    except (ImportError, AttributeError):
        import torchprof_args

        torch_first, value_then = torchprof_args._IMPORT_STATE  # noqa: SLF001
        return torch_first and not value_then


def check_kineto_daemon_env(rank: int) -> bool:
    """Warn once (with the rank) when ``KINETO_USE_DAEMON`` was set after torch was imported."""
    global _kineto_warned
    if _kineto_warned or not kineto_daemon_env_too_late():
        return False
    _kineto_warned = True
    logger.warning(
        "rank %d: KINETO_USE_DAEMON is set, but only after torch was imported, so torch did not "
        "register with dynolog at start-up and 'dyno gputrace --iterations' cannot count steps. "
        "Set it in the environment before Python starts, e.g. with "
        "integrations/dynolog/run_with_dynolog_env.sh, not in the training script.", rank)
    return True
