"""``torchprof trigger``: ask a running ``--torch-profile-on-demand`` job for a trace, or any job
that profiles for every rank's stacks (``--stacks``, answered within 2 s by every rank's stacks
server, on unless the job runs with ``--no-torch-profile-stacks-server``).

Writes a request into the job's control directory, waits for rank 0's answer (taken at the next
check iteration), prints the accepted window and the trace paths, and with ``--wait`` waits until
those traces are published.  Works from any node that sees the control directory (``--job-dir``),
or on the job's node by process id (``--pid``: a rank, or its launcher such as torchrun).

With ``--debug-server HOST:PORT`` the same request goes through the job's
``--torch-profile-debug-server`` (its ``/torchprof_trace`` page, on rank 0's node, which writes it into
the control directory): for a machine that does not see the job's files.  The control directory
stays the default channel: private to the job's user, where the debug server has no authentication.

With ``--stacks`` every rank writes its Python stacks (``--native``: py-spy's native frames too)
into ``<profile dir>/stacks/answers/<id>/``; the command prints where, and the ranks grouped by
where they are, the odd group first (:mod:`torchprof_args.commands.trigger_stacks`).

Exit status, as every command's (``torchprof --help``): 0 done; 1 rejected, timed out or the job
stopped; 2 bad arguments or directory.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from torchprof_args.capture.flags.types import positive_float, positive_int, rank_token
from torchprof_args.capture.ondemand.client import POLL_SECONDS, RequestFailed, submit, wait_for_answer
from torchprof_args.capture.ondemand.protocol import (
    ANSWERS,
    read_job_file,
    read_small_json,
    resolve_control_dir,
)
from torchprof_args.capture.ondemand.registry import find_control_dir_by_pid, registered_processes
from torchprof_args.commands.common import Subparsers
from torchprof_args.commands.trigger_stacks import run_stacks
from torchprof_args.errors import CommandError, ExitStatus

PARTLY_FAILED = ExitStatus.PARTLY_FAILED



def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "trigger", help="ask a running --torch-profile-on-demand job to trace a few iterations",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--job-dir", metavar="DIR",
                       help="the job's --torch-profile-on-demand-dir, or its --torch-profile-dir")
    where.add_argument("--pid", type=positive_int, metavar="PID",
                       help="a rank's process id, or its launcher's (torchrun, srun), on this node")
    where.add_argument("--list", action="store_true",
                       help="list the on-demand jobs of your user on this node")
    where.add_argument("--debug-server", type=_host_port, metavar="HOST:PORT",
                       help="ask through the job's --torch-profile-debug-server (its frontend on rank 0's "
                            "node, trusted networks only) instead of its control directory: from a machine "
                            "that does not see the job's files (--wait needs the trace paths visible here)")
    parser.add_argument("--iterations", type=positive_int, default=3, metavar="N",
                        help="iterations to trace (default 3; the job caps it with "
                             "--torch-profile-on-demand-max-iterations)")
    parser.add_argument("--ranks", type=rank_token, nargs="+", default=[0], metavar="R",
                        help="global ranks to trace, or 'all' (default 0)")
    parser.add_argument("--wait", action="store_true",
                        help="after the answer, wait until the traces are written")
    parser.add_argument("--timeout", type=positive_float, default=None, metavar="S",
                        help="give up after S seconds in all (default 600; 10 with --stacks); an untaken "
                             "request is withdrawn")
    parser.add_argument("--stacks", action="store_true",
                        help="every rank's Python stacks now (any job with a --torch-profile* feature, "
                             "unless it runs with --no-torch-profile-stacks-server), instead of a trace")
    parser.add_argument("--native", action="store_true",
                        help="with --stacks: native frames too, from py-spy (pauses each rank briefly)")
    parser.add_argument("--json", action="store_true", help="print the job's answer as JSON")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.list:
        return _list_jobs()
    if args.native and not args.stacks:
        raise CommandError("--native needs --stacks")
    if args.stacks:
        if args.debug_server:
            raise CommandError("--stacks with --debug-server: the debug server's /stacks page shows "
                               "every rank's stacks (curl http://HOST:PORT/stacks); --stacks asks through "
                               "--job-dir or --pid")
        return run_stacks(args)
    return trigger(args)


def _host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. node17:25999), got {text!r}")
    return host.strip("[]"), int(port)


def _ask_debug_server(address: tuple[str, int], iterations: int, ranks: list[int] | str,
                      timeout: float) -> dict[str, Any]:
    """Rank 0's answer to a trace request through the debug server's ``/torchprof_trace`` page."""
    import urllib.error
    import urllib.parse
    import urllib.request

    host, port = address
    query = urllib.parse.urlencode({"iterations": iterations, "timeout": f"{timeout:g}",
                                    "ranks": ranks if isinstance(ranks, str) else ",".join(map(str, ranks))})
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/torchprof_trace?{query}"
    try:
        with urllib.request.urlopen(url, timeout=timeout + 30.0) as response:
            answer = json.loads(response.read(1 << 20))
    except urllib.error.HTTPError as err:
        missing = "; the job's torchprof-args has no such page" if err.code == 404 else ""
        raise CommandError(f"--debug-server {host}:{port} answered HTTP {err.code}{missing}",
                           PARTLY_FAILED) from None
    except (OSError, ValueError) as err:
        raise CommandError(f"--debug-server {host}:{port}: no answer ({err}); is the job running with "
                           "--torch-profile-debug-server on that port?", PARTLY_FAILED) from None
    if not isinstance(answer, dict):
        raise CommandError(f"--debug-server {host}:{port}: not a trace answer", PARTLY_FAILED)
    if answer.get("status") == "failed":
        raise CommandError(str(answer.get("reason")), PARTLY_FAILED)
    return answer


def _list_jobs() -> int:
    entries = registered_processes()
    if not entries:
        print("no --torch-profile-on-demand job of yours runs on this node")
        return 0
    for pid, entry in sorted(entries.items()):
        print(f"pid {pid:>8}  rank {entry.get('rank', '?'):>5}  {entry.get('control_dir')}")
    return 0


def _control_dir(args: argparse.Namespace) -> Path:
    if args.pid is not None:
        try:
            return find_control_dir_by_pid(args.pid)
        except LookupError as err:
            raise CommandError(str(err)) from None
    try:
        return resolve_control_dir(args.job_dir)
    except FileNotFoundError as err:
        raise CommandError(str(err)) from None


def _read_job(control_dir: Path) -> dict[str, Any]:
    try:
        return read_job_file(control_dir)
    except ValueError as err:
        raise CommandError(str(err)) from None


def _check_request(args: argparse.Namespace, job: dict[str, Any], control_dir: Path) -> list[int] | str:
    """Catch what the job would reject before writing anything."""
    if job.get("state") == "stopped":
        raise CommandError(f"the job using {control_dir} has stopped; nothing to trace", PARTLY_FAILED)
    ranks: list[Any] = args.ranks
    if "all" in ranks:
        if len(ranks) > 1:
            raise CommandError("--ranks: give either 'all' or rank numbers, not both")
        return "all"
    world = job.get("world_size")
    if isinstance(world, int):
        outside = sorted(r for r in ranks if r >= world)
        if outside:
            raise CommandError(f"--ranks {' '.join(map(str, outside))} outside the job's world size {world} "
                               f"(valid ranks are 0..{world - 1})")
    limit = job.get("max_iterations")
    if isinstance(limit, int) and args.iterations > limit:
        raise CommandError(f"--iterations {args.iterations} is more than the job allows ({limit}, its "
                           "--torch-profile-on-demand-max-iterations)")
    return sorted(set(ranks))


def _submit(control_dir: Path, iterations: int, ranks: list[int] | str) -> tuple[str, Path]:
    try:
        return submit(control_dir, iterations, ranks)
    except RequestFailed as err:
        raise CommandError(str(err)) from None


def wait_for_traces(paths: list[str], deadline: float, quiet: bool = False,
                    answer_path: Path | None = None) -> list[str]:
    """Wait until every path exists; returns the ones still missing at the deadline, or at once when
    the job replaced the answer at ``answer_path`` (the window was skipped)."""
    missing = list(paths)
    while missing:
        if answer_path is not None and _answer_status(answer_path) != "accepted":
            break
        still = [p for p in missing if not os.path.exists(p)]
        for path in missing:
            if path not in still and not quiet:
                print(f"written: {path}", flush=True)
        missing = still
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    return missing


def _answer_status(answer_path: Path) -> str | None:
    """The answer's status now ("accepted" while it cannot be read: it is being replaced)."""
    try:
        return read_small_json(answer_path).get("status")
    except (OSError, ValueError):
        return "accepted"


def trigger(args: argparse.Namespace) -> int:
    """Submit, print the answer, and optionally wait for the traces; returns the exit code."""
    timeout = args.timeout if args.timeout is not None else 600.0
    deadline = time.monotonic() + timeout
    answer_path: Path | None = None
    if args.debug_server:
        ranks: list[int] | str = "all" if "all" in args.ranks else sorted(set(args.ranks))
        if not args.json:
            print(f"asking {args.debug_server[0]}:{args.debug_server[1]} for a trace", flush=True)
        answer = _ask_debug_server(args.debug_server, args.iterations, ranks, timeout)
    else:
        control_dir = _control_dir(args)
        job = _read_job(control_dir)
        ranks = _check_request(args, job, control_dir)
        request_id, request_path = _submit(control_dir, args.iterations, ranks)
        if not args.json:
            print(f"request {request_id} sent to {control_dir}; the job checks about every "
                  f"{job.get('check_seconds', '?')} s", flush=True)
        try:
            answer = wait_for_answer(control_dir, request_id, request_path, deadline)
        except RequestFailed as err:
            raise CommandError(str(err), PARTLY_FAILED) from None
        answer_path = control_dir / ANSWERS / f"{request_id}.json"
    if args.json:
        print(json.dumps(answer, indent=1, sort_keys=True), flush=True)
    if answer.get("status") != "accepted":
        if not args.json:
            print(f"rejected: {answer.get('reason', 'no reason given')}", flush=True)
        return PARTLY_FAILED
    traces = [answer["traces"][key] for key in sorted(answer.get("traces", {}), key=int)]
    if not args.json:
        print(f"accepted: {answer.get('message', '')}", flush=True)
        print("trace files:", flush=True)
        for path in traces:
            print(f"  {path}", flush=True)
    if not args.wait:
        return 0
    missing = wait_for_traces(traces, deadline, quiet=args.json, answer_path=answer_path)
    if missing and answer_path is not None and _answer_status(answer_path) == "skipped":
        reason = read_small_json(answer_path).get("reason", "no reason given")
        raise CommandError(f"skipped: {reason}", PARTLY_FAILED)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CommandError(f"timed out: {len(missing)} of {len(traces)} trace(s) not written yet ({shown}); "
                           "--timeout waits longer", PARTLY_FAILED)
    if not args.json:
        print(f"all {len(traces)} trace(s) written", flush=True)
    return 0
