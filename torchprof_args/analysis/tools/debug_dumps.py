"""The periodic dumps of PyTorch's debug server (``--torch-profile-debug-server``), read for
``torchprof hang``: the same answer as from the flight recorder's dumps at a hang, from a job
that still hangs (or was killed without dumping).

In ``<profile dir>/debug_server/`` (names in :data:`~torchprof_args.naming.DEBUG_SERVER_DUMPS`):

* ``torchprof_fr_trace_<time>.txt``: every rank's flight recorders as one JSON object
  (:data:`~torchprof_args.naming.formats.DEBUG_SERVER_FR`), the dumps ``torchprof hang`` analyses;
* ``stacks_<time>.txt``: PyTorch's dump of every rank's Python stacks, faulthandler's text per rank
  (``=== Rank R: <address> ===``, then each thread, innermost frame first), turned here into stacks
  records (:mod:`torchprof_args.shared.stacks_file`) for "where each rank is".  faulthandler names no
  thread: the main thread is the one whose outermost frame is a module's top level (``<module>``),
  the thread answering the dump ("Current thread") never.

The newest dump of each kind that reads whole is taken (the frontend may have been stopped while
writing the last one).  PyTorch's dumper writes each dump in place under the second it was taken
in (opened for writing, then written; a second dump within the same second rewrites the first), so
a dump that changed in the last :data:`SETTLE_S` seconds and reads empty, not whole, or changes
while it is read is being written: it is read again until it is whole or settled, never passed
over for an older one (which can show a rank from before it got stuck).  Import-light (standard
library only).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from torchprof_args.naming import DEBUG_SERVER_DUMPS, DEBUG_SERVER_SUBDIR
from torchprof_args.shared import formats

__all__ = ["ServerDumps", "find_server_dumps", "parse_stacks_dump"]

#: Dump files larger than this are not read (a dump of 10,000 ranks' recorders stays below).
MAX_BYTES = 1 << 30
_RANK_HEADER = re.compile(r"^=== Rank (\d+): (\S*) ===$")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
#: ``http://node17:41234`` -> ``node17``.
_ADDRESS = re.compile(r"^\w+://|:\d+.*$")


@dataclass
class ServerDumps:
    """What the newest readable dumps of a debug-server folder hold (plain data, as each worker
    served it): per recorder and rank the flight-recorder dump, per rank its stacks record and
    its dump info (``world_size``: what ``torchprof hang`` needs of a dumping rank's), and what
    could not be read."""

    directory: Path
    recorders: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    stacks: dict[int, dict[str, Any]] = field(default_factory=dict)
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _newest(directory: Path, kind: str) -> list[Path]:
    return sorted(directory.glob(f"{DEBUG_SERVER_DUMPS[kind]}_*.txt"), reverse=True)


#: A dump changed this recently may still be being written (see the module).
SETTLE_S = 2.0
_RETRY_S = 0.05
_T = TypeVar("_T")


def _read(path: Path) -> str:
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
    return path.read_text(encoding="utf-8")


def _whole(path: Path, parse: Callable[[str], _T]) -> _T:
    """``parse`` of the dump at ``path``, read again while it is being written: changed within
    :data:`SETTLE_S` seconds and empty (``parse`` gives nothing), not whole (ValueError) or changed
    during the read.  Once settled, what ``parse`` gives or raises."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        before = path.stat()
        settled = time.time() - before.st_mtime >= SETTLE_S or time.monotonic() >= deadline
        try:
            value = parse(_read(path))
        except ValueError:
            if settled:
                raise
        else:
            after = path.stat()
            unchanged = (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns)
            if settled or (value and unchanged):
                return value
        time.sleep(_RETRY_S)


def _recorders(path: Path, out: ServerDumps) -> None:
    """The flight-recorder dump at ``path`` into ``out``; ValueError when it is not one, whole."""
    document = _whole(path, json.loads)
    format_name, version = formats.DEBUG_SERVER_FR.name, formats.DEBUG_SERVER_FR.version
    if not isinstance(document, dict) or document.get("format") != format_name:
        raise ValueError(f"not a torchprof debug-server dump (no \"format\": \"{format_name}\")")
    if document.get("version") != version:
        raise ValueError(f"dump version {document.get('version')!r}; this torchprof-args reads {version}")
    world = int(document.get("world_size") or 0)
    for rank_text, entry in (document.get("ranks") or {}).items():
        rank = int(rank_text)
        out.infos[rank] = {"world_size": world, "reason": "PyTorch's debug server's periodic dump",
                           "host": _ADDRESS.sub("", str(entry.get("address", ""))),
                           "time": document.get("time"), "files": [path.name]}
        for recorder, dump in (entry.get("recorders") or {}).items():
            if isinstance(dump, dict) and dump.get("entries"):
                out.recorders.setdefault(recorder, {})[rank] = dump


def parse_stacks_dump(text: str, when: float | None = None) -> dict[int, dict[str, Any]]:
    """PyTorch's stacks dump (faulthandler's text per rank) as stacks records by rank."""
    records: dict[int, dict[str, Any]] = {}
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        header = _RANK_HEADER.match(line)
        if header:
            threads = []
            host = _ADDRESS.sub("", header.group(2))
            records[int(header.group(1))] = {
                "format": formats.STACKS.name, "version": formats.STACKS.version,
                "rank": int(header.group(1)), "host": host, "pid": None,
                "reason": "PyTorch's debug server's periodic dump", "time": when,
                "request": None, "threads": threads, "exception": None,
                "native": {"status": "not asked", "detail": "", "text": ""}}
            continue
        thread = _THREAD.match(line)
        if thread and records:
            threads.append({"name": f"thread {thread.group(2)}", "ident": int(thread.group(2), 16),
                            "answering": thread.group(1) == "Current thread", "main": False,
                            "daemon": None, "frames": []})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].append({"file": frame.group(1), "line": int(frame.group(2)),
                                          "function": frame.group(3).strip(), "code": ""})
    for record in records.values():
        _mark_main(record["threads"])
    return records


def _mark_main(threads: list[dict[str, Any]]) -> None:
    """Flag the main thread (outermost frame ``<module>``) and list it first."""
    candidates = [t for t in threads if not t["answering"] and t["frames"]]
    main = next((t for t in candidates if t["frames"][-1]["function"] == "<module>"), None)
    if main is None and candidates:
        main = max(candidates, key=lambda t: len(t["frames"]))
    if main is not None:
        main["main"] = True
        threads.remove(main)
        threads.insert(0, main)


def _stacks_of(path: Path) -> Callable[[str], dict[int, dict[str, Any]]]:
    """Parses ``path``'s text as a stacks dump taken when the file was last written."""
    return lambda text: parse_stacks_dump(text, path.stat().st_mtime)


def find_server_dumps(path: str | Path) -> ServerDumps | None:
    """The debug server's dumps in ``path`` (its ``debug_server/`` folder, or a profile directory
    holding one); None when there are none.  A dump that does not read whole is a problem, said,
    and the one before it is taken."""
    directory = Path(path)
    if (directory / DEBUG_SERVER_SUBDIR).is_dir():
        directory = directory / DEBUG_SERVER_SUBDIR
    if not directory.is_dir() or not (_newest(directory, "flight_recorder") or _newest(directory, "stacks")):
        return None
    out = ServerDumps(directory)
    for candidate in _newest(directory, "flight_recorder"):
        try:
            _recorders(candidate, out)
            break
        except (OSError, ValueError, TypeError, AttributeError) as err:
            out.recorders.clear()
            out.infos.clear()
            out.problems.append(f"{candidate}: not read ({err})")
    for candidate in _newest(directory, "stacks"):
        try:
            out.stacks = _whole(candidate, _stacks_of(candidate))
        except (OSError, ValueError) as err:
            out.problems.append(f"{candidate}: not read ({err})")
            continue
        if out.stacks:
            break
    return out
