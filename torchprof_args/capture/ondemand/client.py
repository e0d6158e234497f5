"""The requesting side of an on-demand trace: write a request into a job's control directory, wait
for rank 0's answer.  ``torchprof trigger`` and the debug server's trace page
(``runtime/debug_server/pages.py``) both ask through it: one path to a trace on request.

Import-light (standard library only).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from torchprof_args.capture.ondemand.protocol import (
    ANSWERS,
    REQUESTS,
    make_request,
    read_job_file,
    read_small_json,
    write_control_file,
)
from torchprof_args.private_dir import check_private_dir

__all__ = ["RequestFailed", "submit", "wait_for_answer", "withdraw"]

POLL_SECONDS = 0.2


class RequestFailed(Exception):
    """A request that could not be sent or answered; the message is one sentence saying what to do.

    ``sent``: the request reached the job (it timed out, was withdrawn, or the job stopped), as
    opposed to one that could not be written at all."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


def submit(control_dir: Path, iterations: int, ranks: list[int] | str) -> tuple[str, Path]:
    """Write one request into ``control_dir`` atomically; returns its id and path.

    Raises:
        RequestFailed: the directory is not private to this user, or the request cannot be written.
    """
    problem = check_private_dir(control_dir, "control directory")
    problem = problem or check_private_dir(control_dir / REQUESTS, "control directory")
    if problem:
        raise RequestFailed(problem, sent=False)
    request = make_request(iterations, ranks)
    path = control_dir / REQUESTS / f"{request['id']}.json"
    try:
        write_control_file(path, request)
    except OSError as err:
        raise RequestFailed(f"cannot write the request {path}: {err.strerror or err}", sent=False) from None
    return request["id"], path


def withdraw(request_path: Path) -> bool:
    """Remove a request the job has not taken yet; False when it was taken meanwhile."""
    try:
        os.unlink(request_path)
        return True
    except FileNotFoundError:
        return False


def _job(control_dir: Path) -> dict[str, Any]:
    try:
        return read_job_file(control_dir)
    except ValueError as err:
        raise RequestFailed(str(err), sent=True) from None


def wait_for_answer(control_dir: Path, request_id: str, request_path: Path, deadline: float,
                    timeout_hint: str = "--timeout") -> dict[str, Any]:
    """Rank 0's answer to the request (a ``time.monotonic()`` ``deadline``; a request taken just
    before it gets 10 s more for its answer).  ``timeout_hint`` names what gives more time.

    Raises:
        RequestFailed: no answer in time (an untaken request is withdrawn), or the job stopped.
    """
    answer_path = control_dir / ANSWERS / f"{request_id}.json"
    grace_given = False
    while True:
        if answer_path.exists():
            try:
                return read_small_json(answer_path)
            except (OSError, ValueError) as err:
                raise RequestFailed(f"cannot read the answer {answer_path}: {err}", sent=True) from None
        job = _job(control_dir)
        if job.get("state") == "stopped" and request_path.exists():
            withdraw(request_path)
            raise RequestFailed("the job stopped before taking the request", sent=True)
        if time.monotonic() >= deadline:
            if withdraw(request_path):
                raise RequestFailed(f"no answer within {timeout_hint}; the request was withdrawn. The job "
                                    f"checks about every {job.get('check_seconds', '?')} s: is it still "
                                    "training?", sent=True)
            if grace_given:
                raise RequestFailed(f"the job took the request but wrote no answer to {answer_path}; "
                                    "see rank 0's log", sent=True)
            grace_given, deadline = True, deadline + 10.0  # taken just now: the answer is on its way
        time.sleep(POLL_SECONDS)
