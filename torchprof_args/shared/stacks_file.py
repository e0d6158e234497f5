"""The stacks file: one rank's Python threads at a hang or on request, in one place for both sides.

The runtime (:mod:`torchprof_args.capture.stacks.dumper`) writes it, ``torchprof hang`` and ``torchprof
trigger --stacks`` (:mod:`torchprof_args.analysis.analyzers.where`) read it; neither imports the other.
One JSON object (``stacks_rank<R>.json``, mode 0600, published atomically)::

    {"format": "torchprof-stacks", "version": 1, "rank": 2, "host": "node3", "pid": 4242,
     "reason": "...", "time": 1700000000.0, "request": null,
     "threads": [{"name": "MainThread", "ident": 1, "native_id": 4242, "main": true, "daemon": false,
                  "frames": [{"file": "train.py", "line": 88, "function": "main", "code": "..."}]}],
     "exception": null | {"type": "RuntimeError", "message": "...", "frames": [...]},
     "native": {"status": "ok" | "unavailable" | "failed" | "not asked", "detail": "...", "text": "..."}}

Threads are listed main thread first; frames innermost first.  Import-light (standard library only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torchprof_args.shared import formats

__all__ = ["frame_text", "load_stacks", "main_frames", "signature", "user_frames"]

#: Files larger than this are not stacks files (thousands of threads would still fit).
MAX_BYTES = 16 << 20
#: Frames of this package (the dump itself, the fence, the profiler's step) say nothing of the hang.
_OWN_PACKAGE = f"{os.sep}torchprof_args{os.sep}"
#: Library frames: the application's own frame is the first one outside these.
_LIBRARY_MARKERS = (f"{os.sep}torch{os.sep}", f"{os.sep}site-packages{os.sep}", f"{os.sep}lib{os.sep}python3")


def load_stacks(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check one stacks file; raises ValueError with a sentence naming the file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ValueError(f"{path}: larger than {MAX_BYTES >> 20} MiB, not a stacks file")
        payload = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(payload, dict) or payload.get("format") != formats.STACKS.name:
        raise ValueError(f"{path}: not a torchprof stacks file (no \"format\": \"{formats.STACKS.name}\")")
    if payload.get("version") != formats.STACKS.version:
        raise ValueError(f"{path}: stacks format version {payload.get('version')!r}; this torchprof-args "
                         f"reads version {formats.STACKS.version}: use the job's torchprof-args")
    if not isinstance(payload.get("rank"), int) or not isinstance(payload.get("threads"), list):
        raise ValueError(f"{path}: a stacks file without a rank or a thread list")
    return payload


def frame_text(frame: dict[str, Any], full_path: bool = False) -> str:
    """``file:line in function`` (the file's base name unless ``full_path``)."""
    name = str(frame.get("file", "?"))
    return f"{name if full_path else os.path.basename(name)}:{frame.get('line')} in {frame.get('function')}"


def main_frames(record: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The main thread's frames, innermost first, without this package's own, and where they come
    from: ``"raised"`` (the exception that left the profiler: where the rank was), else ``"live"``."""
    exception = record.get("exception")
    if isinstance(exception, dict) and exception.get("frames"):
        return [f for f in exception["frames"] if _OWN_PACKAGE not in str(f.get("file"))], "raised"
    for thread in record.get("threads", []):
        if thread.get("main"):
            return [f for f in thread.get("frames", []) if _OWN_PACKAGE not in str(f.get("file"))], "live"
    return [], "live"


def user_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames of the application (not torch, not an installed library, not the standard library)."""
    return [f for f in frames if not any(m in str(f.get("file")) for m in _LIBRARY_MARKERS)]


def signature(record: dict[str, Any], depth: int = 3) -> tuple[str, ...]:
    """What two ranks must share to be "at the same place": the main thread's innermost ``depth``
    frames (file, line, function)."""
    frames, _ = main_frames(record)
    return tuple(frame_text(f, full_path=True) for f in frames[:depth])
