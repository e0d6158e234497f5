"""The per-node registry: pid -> control directory, for ``torchprof trigger --pid``.

Every rank of an on-demand job writes ``<pid>.json`` into a per-user directory on its node
(``/tmp/torchprof-<uid>/ondemand-jobs``, or ``$TORCHPROF_RUNTIME_DIR/ondemand-jobs``), so that
the trigger finds the job from a rank's pid or from its launcher's (torchrun, srun) by walking
``/proc``.  Stale entries (dead pids, reused pids) are removed when read.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from torchprof_args.capture.ondemand.protocol import MAX_REQUEST_BYTES, read_small_json, write_control_file
from torchprof_args.log import get_logger
from torchprof_args.naming import short_hostname
from torchprof_args.private_dir import check_private_dir

__all__ = ["ONDEMAND_REGISTRY", "STACKS_REGISTRY",
           "find_control_dir_by_pid", "register_process", "registered_processes", "registry_dir",
           "unregister_process"]

logger = get_logger(__name__)

_RUNTIME_ENV = "TORCHPROF_RUNTIME_DIR"
#: One registry per kind of control directory: on-demand tracing's, and the stacks server's.
ONDEMAND_REGISTRY, STACKS_REGISTRY = "ondemand-jobs", "stacks-jobs"


def registry_dir(kind: str = ONDEMAND_REGISTRY) -> Path:
    """``$TORCHPROF_RUNTIME_DIR/<kind>``, else ``/tmp/torchprof-<uid>/<kind>`` (``ondemand-jobs``,
    ``stacks-jobs``).

    A fixed path rather than ``$TMPDIR``: schedulers give each job its own ``TMPDIR``, and the
    trigger runs outside the job.
    """
    base = os.environ.get(_RUNTIME_ENV) or os.path.join("/tmp", f"torchprof-{os.getuid()}")
    return Path(base) / kind


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


def register_process(control_dir: str, rank: int, kind: str = ONDEMAND_REGISTRY) -> Path | None:
    """Record this process in the node's registry of ``kind``; returns the entry (None if it could
    not be written)."""
    directory = registry_dir(kind)
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
        write_control_file(entry, {"pid": os.getpid(), "rank": rank, "control_dir": control_dir,
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


def registered_processes(kind: str = ONDEMAND_REGISTRY) -> dict[int, dict[str, Any]]:
    """Live registry entries of this user on this node, by pid; stale entries are removed."""
    directory = registry_dir(kind)
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


def find_control_dir_by_pid(pid: int, kind: str = ONDEMAND_REGISTRY) -> Path:
    """The control directory of the job that ``pid`` is a rank of, or an ancestor of (torchrun, srun).

    Raises LookupError with a sentence that says what to do.
    """
    entries = registered_processes(kind)
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
    started = "started with --torch-profile-on-demand"
    if kind == STACKS_REGISTRY:
        started = ("serving its stacks (the profiler on, with any --torch-profile* feature, and not "
                   "--no-torch-profile-stacks-server)")
    raise LookupError(
        f"--pid {pid}: no job {started} is that process or runs under it "
        f"on this node (registry {registry_dir(kind)}); check the pid and the user, or use --job-dir "
        "(needed from another node)."
    )

