"""Every Python thread's stack of this rank, written as one file: where the rank *is* at a hang.

:class:`StackDumper` reads the stacks with ``sys._current_frames()`` from whatever thread calls it
(the SIGTERM watchdog, the stacks server), so it works while the main thread is blocked in C code
that released the GIL (a collective, a read from a pipe); a C call that holds the GIL blocks it,
and then only py-spy (from outside) can help.  Native frames come from ``py-spy dump --native
--pid`` when py-spy is installed and ptrace is allowed (the Python stacks are written first, then
rewritten with the native ones, so a dying rank leaves at least those); when py-spy cannot attach
this is said once per process.  The file format is :mod:`torchprof_args.shared.stacks_file`'s.

Import-light: standard library only.
"""

from __future__ import annotations

import linecache
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any

from torchprof_args.atomic import write_json_atomically
from torchprof_args.log import get_logger
from torchprof_args.naming import short_hostname, stacks_file_name
from torchprof_args.shared import formats

__all__ = ["StackDumper", "collect_threads", "mark_signal_handler", "native_stacks"]

logger = get_logger(__name__)

#: Frames kept per thread (innermost first): a deep recursion must not make a huge file.
MAX_FRAMES = 200
#: py-spy gets this long to attach and unwind (it pauses the process meanwhile).
NATIVE_TIMEOUT = 10.0
#: Said once per process: py-spy missing or not allowed to attach.
_NATIVE_STATE: dict[str, Any] = {"said": False}


#: Code of this package's signal handlers: a thread inside one was interrupted where its caller
#: frame stands; the handler's own frames (a dump in progress) are left out of its stack.
_SIGNAL_HANDLERS: set[CodeType] = set()


def mark_signal_handler(function: Any) -> None:
    """Register ``function`` (a handler of this package) so that stacks skip its frames and theirs."""
    _SIGNAL_HANDLERS.add(function.__code__)


def _frames_of(frame: FrameType | None) -> list[dict[str, Any]]:
    """``frame`` and its callers, innermost first, with each line's source text; a signal handler
    of this package and everything it called are left out (the thread was where the handler
    interrupted it)."""
    frames: list[dict[str, Any]] = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        if code in _SIGNAL_HANDLERS:
            frames.clear()
            frame = frame.f_back
            continue
        line = frame.f_lineno or 0
        frames.append({"file": code.co_filename, "line": line, "function": code.co_name,
                       "code": linecache.getline(code.co_filename, line).strip()})
        frame = frame.f_back
    return frames


def _traceback_frames(tb: TracebackType | None) -> list[dict[str, Any]]:
    """An exception's traceback, innermost first (where it was raised, then its callers)."""
    frames = [{"file": s.filename, "line": s.lineno or 0, "function": s.name, "code": (s.line or "").strip()}
              for s in traceback.extract_tb(tb)]
    return frames[::-1][:MAX_FRAMES]


def collect_threads() -> list[dict[str, Any]]:
    """Every Python thread's stack now, the main thread first (the caller's own thread included)."""
    current = sys._current_frames()  # noqa: SLF001 - the one way to read another thread's stack
    by_ident = {thread.ident: thread for thread in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for ident, frame in current.items():
        thread = by_ident.get(ident)
        threads.append({"name": thread.name if thread else f"thread {ident}", "ident": ident,
                        "native_id": getattr(thread, "native_id", None), "main": ident == main,
                        "daemon": bool(thread and thread.daemon), "frames": _frames_of(frame)})
    threads.sort(key=lambda t: (not t["main"], t["name"]))
    return threads


def _py_spy() -> str | None:
    """py-spy beside this Python (a virtual environment's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def native_stacks(pid: int | None = None, timeout: float = NATIVE_TIMEOUT) -> dict[str, Any]:
    """``py-spy dump --native`` of this process: ``{"status", "detail", "text"}``; never raises."""
    tool = _py_spy()
    if tool is None:
        return _unavailable("py-spy is not installed (pip install py-spy): Python frames only")
    try:
        done = subprocess.run([tool, "dump", "--native", "--pid", str(pid or os.getpid())],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "detail": f"py-spy did not answer within {timeout:g} s", "text": ""}
    except OSError as err:
        return _unavailable(f"py-spy could not run ({err.strerror or err})")
    if done.returncode != 0:
        error = " ".join((done.stderr or done.stdout).split())[:300]
        if any(word in error.lower() for word in ("permission", "not permitted", "ptrace")):
            return _unavailable(f"py-spy may not attach (ptrace not allowed here: {error}); run as root, "
                                "with CAP_SYS_PTRACE, or with kernel.yama.ptrace_scope=0 for native frames")
        return {"status": "failed", "detail": f"py-spy failed: {error}", "text": ""}
    return {"status": "ok", "detail": f"{tool} dump --native", "text": done.stdout}


def _unavailable(detail: str) -> dict[str, Any]:
    if not _NATIVE_STATE["said"]:
        _NATIVE_STATE["said"] = True
        logger.warning("rank stacks: no native frames: %s", detail)
    return {"status": "unavailable", "detail": detail, "text": ""}


class StackDumper:
    """Writes this rank's stacks file: :meth:`dump` at a hang (into the flight-recorder folder),
    :meth:`write` for a request (into its answer folder)."""

    def __init__(self, directory: str | os.PathLike[str], rank: int, *, native: bool = True) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.native = native
        self._last: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        """Where :meth:`dump` writes: ``<directory>/stacks_rank<R>.json``."""
        return self.directory / stacks_file_name(self.rank)

    def record(self, reason: str, *, exc: BaseException | None = None,
               request: str | None = None) -> dict[str, Any]:
        """This rank's stacks now, as the file holds them (native frames not yet asked)."""
        exception = None
        if exc is not None:
            exception = {"type": type(exc).__name__, "message": str(exc)[:500],
                         "frames": _traceback_frames(exc.__traceback__)}
        return {"format": formats.STACKS.name, "version": formats.STACKS.version, "rank": self.rank,
                "host": short_hostname(),
                "pid": os.getpid(), "reason": " ".join(reason.split()), "time": time.time(),
                "request": request, "threads": collect_threads(), "exception": exception,
                "native": {"status": "not asked", "detail": "", "text": ""}}

    def write(self, path: str | os.PathLike[str], reason: str, *, exc: BaseException | None = None,
              request: str | None = None, native: bool = False) -> Path:
        """Publish the stacks at ``path`` (0600, atomically); with ``native``, publish again with
        py-spy's native frames once it answered.  Raises OSError."""
        payload = self.record(reason, exc=exc, request=request)
        write_json_atomically(path, payload, private=True)
        if native:
            payload["native"] = native_stacks()
            write_json_atomically(path, payload, private=True)
        return Path(path)

    def dump(self, reason: str, exc: BaseException | None = None) -> Path | None:
        """At a hang: ``<directory>/stacks_rank<R>.json``, Python frames only (quick); never raises.
        :meth:`add_native` adds py-spy's frames after whatever else must be dumped first."""
        try:
            self._last = self.record(reason, exc=exc)
            write_json_atomically(self.path, self._last, private=True)
        except Exception as err:  # noqa: BLE001 - forensics must never make things worse
            logger.error("rank %d: writing the stacks failed (%s: %s)", self.rank, type(err).__name__, err)
            return None
        logger.warning("rank %d: Python stacks of every thread written to %s (%s)", self.rank, self.path,
                       reason)
        return self.path

    def add_native(self) -> None:
        """Rewrite the last :meth:`dump` with py-spy's native frames (when ``native``); never raises."""
        payload = self._last
        if payload is None or not self.native:
            return
        try:
            payload["native"] = native_stacks()
            write_json_atomically(self.path, payload, private=True)
        except Exception as err:  # noqa: BLE001
            logger.error("rank %d: adding native frames failed (%s: %s)", self.rank, type(err).__name__, err)
