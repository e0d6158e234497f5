"""The on-demand control directory's files, and the validation of what arrives there.

No daemon: requests travel through a **control directory** on a filesystem that rank 0 and the
person triggering can both reach (the shared filesystem of a SLURM job, or a local disk)::

    CONTROL_DIR/                 # default <profile dir>/ondemand, mode 0700, owned by the job's user
      job.json                   # written by rank 0: world size, check interval, limits, state
      requests/<id>.json         # written by `torchprof trigger` (hidden temp name, then rename)
      processed/<id>.json        # rank 0 renames a request here to take it: atomic, taken once
      answers/<id>.json          # rank 0's answer: accepted window and trace paths, or the reason

Safety: the control directory must belong to the job's user and not be group- or world-writable
(:mod:`torchprof_args.private_dir`); requests must be regular files (no symlinks) of that user,
small, JSON with known fields only and bounded values.  Anything else is rejected with a reason.
Import-light: used by ``torchprof trigger`` as well as by the job.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Any, TypeGuard

from torchprof_args.atomic import write_json_atomically
from torchprof_args.capture.ondemand.config import CONTROL_SUBDIR
from torchprof_args.naming import short_hostname
from torchprof_args.shared import formats

__all__ = [
    "ANSWERS",
    "JOB_FILE",
    "PROCESSED",

    "REQUESTS",
    "RequestRejected",
    "StacksRequest",
    "TraceRequest",
    "make_request",
    "make_stacks_request",
    "parse_request",
    "read_request_file",
    "read_job_file",
    "read_small_json",
    "read_stacks_request",
    "resolve_control_dir",
    "write_control_file",
]

JOB_FILE = "job.json"
REQUESTS, PROCESSED, ANSWERS = "requests", "processed", "answers"
#: Request files larger than this are rejected unread.
MAX_REQUEST_BYTES = 4096
REQUEST_FIELDS = frozenset({"version", "id", "iterations", "ranks", "requested_by", "created"})
REQUESTED_BY_FIELDS = frozenset({"host", "pid", "uid"})
#: A request id, which is also its file name without ``.json``.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class RequestRejected(ValueError):
    """A trace request that is not valid; the message is the reason given in the answer."""


def write_control_file(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Publish a control file (job, request, answer): mode 0600, readable JSON, atomically."""
    write_json_atomically(path, payload, private=True, indent=1, sort_keys=True)


def read_small_json(path: str | os.PathLike[str], limit: int = 1 << 20) -> Any:
    """Parse a JSON file of at most ``limit`` bytes, refusing symlinks; raises OSError/ValueError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return json.loads(data)


def read_job_file(control_dir: Path) -> dict[str, Any]:
    """The job description a running job published in ``control_dir``; ValueError with a sentence
    naming the file when it cannot be read or is not one."""
    path = control_dir / JOB_FILE
    try:
        job = read_small_json(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err}") from None
    if not isinstance(job, dict):
        raise ValueError(f"{path} is not a job description")
    return job


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


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """A validated request: trace ``iterations`` iterations on ``ranks`` (None = all ranks)."""

    request_id: str
    iterations: int
    ranks: tuple[int, ...] | None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _payload(data: bytes, request_id: str, fields: frozenset[str]) -> dict[str, Any]:
    """The JSON object of a request file, checked for what every kind of request shares: its size,
    JSON, only ``fields``, the protocol version, an ``id`` that matches the file name."""
    if len(data) > MAX_REQUEST_BYTES:
        raise RequestRejected(f"the request file is larger than {MAX_REQUEST_BYTES} bytes")
    try:
        payload = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestRejected(f"the request is not valid JSON ({err})") from None
    if not isinstance(payload, dict):
        raise RequestRejected("the request must be a JSON object")
    unknown = sorted(set(payload) - fields)
    if unknown:
        raise RequestRejected(f"unknown field(s) {', '.join(map(repr, unknown))[:200]}; known fields are "
                              f"{', '.join(sorted(fields))}")
    if payload.get("version", formats.ONDEMAND.version) != formats.ONDEMAND.version:
        raise RequestRejected(f"protocol version {payload.get('version')!r} is not supported "
                              f"(this job speaks version {formats.ONDEMAND.version}); "
                              "use the same torchprof-args")
    if "id" in payload and payload["id"] != request_id:
        raise RequestRejected("the id field does not match the file name")
    return payload


def parse_request(data: bytes, *, request_id: str, world_size: int, max_iterations: int) -> TraceRequest:
    """Validate the bytes of one request file; raises :class:`RequestRejected` with the reason."""
    payload = _payload(data, request_id, REQUEST_FIELDS)
    iterations = payload.get("iterations")
    if not _is_int(iterations) or not 1 <= iterations <= max_iterations:
        raise RequestRejected(f"iterations must be a whole number from 1 to {max_iterations} "
                              f"(--torch-profile-on-demand-max-iterations), got {iterations!r}")
    ranks = payload.get("ranks", [0])
    if ranks == "all":
        ranks_tuple = None
    else:
        if not isinstance(ranks, list) or not ranks or not all(_is_int(r) for r in ranks):
            raise RequestRejected(
                f"ranks must be 'all' or a non-empty list of global ranks, got {ranks!r}"[:300]
            )
        outside = sorted({r for r in ranks if not 0 <= r < world_size})
        if outside:
            raise RequestRejected(f"rank(s) {' '.join(map(str, outside[:10]))} outside the world size "
                                  f"{world_size} (valid ranks are 0..{world_size - 1})")
        ranks_tuple = tuple(sorted(set(ranks)))
    _check_origin(payload)
    return TraceRequest(request_id, iterations, ranks_tuple)


def _check_origin(payload: dict[str, Any]) -> None:
    """The ``requested_by`` and ``created`` fields every request may carry."""
    requested_by = payload.get("requested_by", {})
    if not isinstance(requested_by, dict) or set(requested_by) - REQUESTED_BY_FIELDS or not all(
        isinstance(v, (str, int)) and len(str(v)) <= 100 for v in requested_by.values()
    ):
        raise RequestRejected(
            f"requested_by must be an object with fields {', '.join(sorted(REQUESTED_BY_FIELDS))}"
        )
    if "created" in payload and not isinstance(payload["created"], (int, float)):
        raise RequestRejected("created must be a number (seconds since the epoch)")


def make_request(iterations: int, ranks: list[int] | str, request_id: str | None = None) -> dict[str, Any]:
    """The JSON payload ``torchprof trigger`` writes."""
    return {
        "version": formats.ONDEMAND.version,
        "id": request_id or new_request_id(),
        "iterations": iterations,
        "ranks": ranks,
        "requested_by": {"host": short_hostname(), "pid": os.getpid(), "uid": os.getuid()},
        "created": time.time(),
    }


def read_request_file(path: str, request_id: str, *, world_size: int, max_iterations: int) -> TraceRequest:
    """Read and validate the request file ``path`` (a regular file of this user, small); raises
    :class:`RequestRejected` with the reason."""
    return parse_request(_read_request_bytes(path), request_id=request_id, world_size=world_size,
                         max_iterations=max_iterations)


def _read_request_bytes(path: str) -> bytes:
    """The bytes of a request file: a regular file (no symlink) of this user, small."""
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
        return handle.read(MAX_REQUEST_BYTES + 1)


# -- stacks requests (`torchprof trigger --stacks`): every rank reads and answers them itself ------

STACKS_REQUEST_FIELDS = frozenset({"version", "id", "kind", "native", "requested_by", "created"})


@dataclasses.dataclass(frozen=True)
class StacksRequest:
    """A validated stacks request: every rank writes its stacks (``native``: py-spy's frames too)."""

    request_id: str
    native: bool


def make_stacks_request(native: bool, request_id: str | None = None) -> dict[str, Any]:
    """The JSON payload ``torchprof trigger --stacks`` writes."""
    return {"version": formats.ONDEMAND.version, "id": request_id or new_request_id(), "kind": "stacks",
            "native": native, "created": time.time(),
            "requested_by": {"host": short_hostname(), "pid": os.getpid(), "uid": os.getuid()}}


def parse_stacks_request(data: bytes, request_id: str) -> StacksRequest:
    """Validate the bytes of one stacks request; raises :class:`RequestRejected` with the reason."""
    if not ID_PATTERN.fullmatch(request_id):
        raise RequestRejected("the request's file name is not a valid request id")
    payload = _payload(data, request_id, STACKS_REQUEST_FIELDS)
    if payload.get("kind") != "stacks":
        raise RequestRejected(f"kind must be 'stacks', got {payload.get('kind')!r}"[:200])
    if not isinstance(payload.get("native", False), bool):
        raise RequestRejected("native must be true or false")
    _check_origin(payload)
    return StacksRequest(request_id, bool(payload.get("native", False)))


def read_stacks_request(path: str, request_id: str) -> StacksRequest:
    """Read and validate a stacks request file (checked like a trace request's)."""
    return parse_stacks_request(_read_request_bytes(path), request_id)
