"""``torchprof trigger --stacks``: every rank's Python stacks, now, from a running or hung job.

Writes a stacks request into the job's stacks control directory (``<profile dir>/stacks``, see
:mod:`torchprof_args.capture.stacks.server`), waits until every rank answered (each rank's server
thread looks once a second) or ``--timeout`` (default 10 s), withdraws the request, and prints
where the answers are and the merged view (:mod:`torchprof_args.analysis.analyzers.where`): ranks at
the same frames grouped, the odd group first.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from torchprof_args.capture.ondemand.protocol import (
    ANSWERS,
    JOB_FILE,
    REQUESTS,
    make_stacks_request,
    read_job_file,
    read_small_json,
    write_control_file,
)
from torchprof_args.capture.ondemand.registry import STACKS_REGISTRY, find_control_dir_by_pid
from torchprof_args.errors import CommandError, ExitStatus
from torchprof_args.naming import STACKS_CONTROL_SUBDIR
from torchprof_args.private_dir import check_private_dir

__all__ = ["DEFAULT_TIMEOUT", "request_stacks", "run_stacks"]

#: Seconds to wait for every rank unless --timeout says otherwise.
DEFAULT_TIMEOUT = 10.0
STACKS_POLL_SECONDS = 0.05
_ANSWER_RE = re.compile(r"^(stacks|rejected)_rank(\d+)\.json$")



def control_dir(job_dir: str | None, pid: int | None) -> Path:
    """The stacks control directory from ``--job-dir`` (it, or its ``stacks/``) or ``--pid``."""
    if pid is not None:
        try:
            return find_control_dir_by_pid(pid, STACKS_REGISTRY)
        except LookupError as err:
            raise CommandError(str(err)) from None
    base = Path(job_dir or ".")
    for candidate in (base, base / STACKS_CONTROL_SUBDIR):
        if (candidate / JOB_FILE).is_file() and _job(candidate).get("kind") == "stacks":
            return candidate
    raise CommandError(
        f"--job-dir {str(base)!r}: no stacks server's {JOB_FILE} there or in {STACKS_CONTROL_SUBDIR}/; give "
        "the job's --torch-profile-dir (every rank serves its stacks once the job has entered the profiler, "
        "with any --torch-profile* feature, unless it runs with --no-torch-profile-stacks-server)")


def _job(directory: Path) -> dict[str, Any]:
    try:
        return read_job_file(directory)
    except ValueError as err:
        raise CommandError(str(err)) from None


def _answers(folder: Path) -> tuple[list[int], dict[int, str]]:
    """Ranks that answered with stacks, and those that rejected the request (with the reason)."""
    answered: list[int] = []
    rejected: dict[int, str] = {}
    if not folder.is_dir():
        return answered, rejected
    for entry in folder.iterdir():
        match = _ANSWER_RE.match(entry.name)
        if not match:
            continue
        rank = int(match.group(2))
        if match.group(1) == "stacks":
            answered.append(rank)
        else:
            try:
                rejected[rank] = str(read_small_json(entry).get("reason"))
            except (OSError, ValueError, AttributeError):
                rejected[rank] = "unreadable rejection"
    return sorted(answered), rejected


def request_stacks(directory: Path, *, native: bool, timeout: float) -> dict[str, Any]:
    """Ask every rank of the job at ``directory``; wait for the answers; the outcome as plain data."""
    job = _job(directory)
    if job.get("state") == "stopped":
        raise CommandError(f"the job using {directory} has stopped; there are no stacks to take",
                           ExitStatus.PARTLY_FAILED)
    problem = check_private_dir(directory, "stacks control directory")
    problem = problem or check_private_dir(directory / REQUESTS, "stacks control directory")
    if problem:
        raise CommandError(problem)
    world = int(job.get("world_size") or 1)
    request = make_stacks_request(native)
    path = directory / REQUESTS / f"{request['id']}.json"
    folder = directory / ANSWERS / request["id"]
    started = time.monotonic()
    try:
        write_control_file(path, request)
    except OSError as err:
        raise CommandError(f"cannot write the request {path}: {err.strerror or err}") from None
    try:
        while True:
            answered, rejected = _answers(folder)
            if len(answered) + len(rejected) >= world or time.monotonic() - started >= timeout:
                break
            time.sleep(STACKS_POLL_SECONDS)
    finally:
        path.unlink(missing_ok=True)  # withdrawn: a rank that looks later does not answer
    return {"request": request["id"], "directory": str(folder), "world_size": world,
            "seconds": round(time.monotonic() - started, 3), "answered": answered, "rejected": rejected,
            "missing": sorted(set(range(world)) - set(answered) - set(rejected))}


def run_stacks(args: argparse.Namespace) -> int:
    """``torchprof trigger --stacks``: returns the exit code (0: every rank answered)."""
    from torchprof_args.analysis.analyzers.where import find_stacks, format_where, where_ranks_are

    timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT
    outcome = request_stacks(control_dir(args.job_dir, args.pid), native=args.native, timeout=timeout)
    stacks, problems = find_stacks(outcome["directory"]) if outcome["answered"] else ({}, [])
    where = where_ranks_are(stacks, world_size=outcome["world_size"])
    if args.json:
        print(json.dumps({**outcome, "where": where, "problems": problems}, default=str))
    else:
        print(f"stacks of {len(outcome['answered'])} of {outcome['world_size']} ranks in "
              f"{outcome['seconds']:.1f} s: {outcome['directory']}")
        print("\n".join(format_where(where, missing=f"no answer within {timeout:g} s")))
        for rank, reason in sorted(outcome["rejected"].items()):
            print(f"rank {rank} rejected the request: {reason}")
        for problem in problems:
            print(f"note: {problem}")
    return ExitStatus.OK if not outcome["missing"] and not outcome["rejected"] else ExitStatus.PARTLY_FAILED
