"""Hang forensics from flight-recorder dumps: PyTorch's own analyzer, then the answer in a few lines.

The dumps (one per rank, ``<prefix><rank>`` in ``<profile dir>/flight_recorder/``, see
:mod:`torchprof_args.capture.runtime.flight_recorder`) are handed to PyTorch's analyzer
(``torch.distributed.flight_recorder``: ``read_dir`` + ``build_db``), which matches every
collective across ranks and says which ranks did not join which one.  Before that they are read
without running code (plain-data unpickler) and **normalised** into a temporary directory:

* PyTorch's gloo dumps carry an empty process-group table (``{'': {'name': '', 'ranks': '[]'}}``),
  on which the analyzer fails with ``KeyError: ('0', 0)``; each rank's table is rebuilt from the
  tables the dumping ranks wrote beside their dumps (``dump_info_rank<R>.json``), else from which
  ranks' entries name each group (the default group: every rank);
* a group whose members' dumps are missing is analysed with ``--allow-incomplete-ranks``, and the
  missing dumps are part of the answer (a rank that never dumped is often the one that hung).

The answer (:func:`analyse_dumps`) lists, per process group, the collectives some ranks did not
join (or joined differently), who waited in them, each missing rank's last completed collective
in that group and what it was doing last, with the recorded Python stacks.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import pickle
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from torchprof_args.analysis.analyzers.where import find_stacks, where_ranks_are
from torchprof_args.analysis.tools.debug_dumps import find_server_dumps
from torchprof_args.analysis.tools.hang_clocks import dump_clocks, last_issued
from torchprof_args.errors import TraceError
from torchprof_args.naming import FLIGHT_RECORDER_PREFIXES, FLIGHT_RECORDER_SUBDIR
from torchprof_args.torch_support import needs

HANG_FEATURE = "torchprof hang"

__all__ = ["analyse_dumps", "find_dumps", "load_dump", "normalise_dumps"]

_INFO_RE = re.compile(r"^dump_info_rank(\d+)\.json$")


def find_dumps(path: str | Path) -> tuple[Path, dict[str, dict[int, Path]], dict[int, dict[str, Any]]]:
    """``(directory, {backend: {rank: dump file}}, {rank: dump info})`` under ``path`` (a profile
    directory or its ``flight_recorder/``; a folder of stacks alone has no dumps)."""
    directory = Path(path)
    if (directory / FLIGHT_RECORDER_SUBDIR).is_dir():
        directory = directory / FLIGHT_RECORDER_SUBDIR
    if not directory.is_dir():
        raise TraceError(f"{path}: no such directory (give the --torch-profile-dir of the run, or its "
                         f"{FLIGHT_RECORDER_SUBDIR}/)")
    dumps: dict[str, dict[int, Path]] = {}
    infos: dict[int, dict[str, Any]] = {}
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        info = _INFO_RE.match(entry.name)
        if info:
            with contextlib.suppress(OSError, ValueError):
                infos[int(info.group(1))] = json.loads(entry.read_text())
            continue
        for backend, prefix in FLIGHT_RECORDER_PREFIXES.items():
            if entry.name.startswith(prefix) and entry.name[len(prefix):].isdigit():
                dumps.setdefault(backend, {})[int(entry.name[len(prefix):])] = entry
    return directory, dumps, infos


def load_dump(path: Path) -> dict[str, Any]:
    """One rank's dump, read without running code; TraceError for anything but a flight-recorder dump."""
    from torchprof_args.analysis.memory.snapshot import SafeUnpickler

    try:
        dump = SafeUnpickler(io.BytesIO(path.read_bytes())).load()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 - refused globals, truncated files, not a pickle
        raise TraceError(f"{path}: not a plain-data flight-recorder dump "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list) or "version" not in dump:
        raise TraceError(f"{path}: not a flight-recorder dump (no 'entries' list and 'version')")
    return dump


def _ranks_of(value: Any) -> list[int]:
    try:
        ranks = ast.literal_eval(value) if isinstance(value, str) else value
        return sorted(int(r) for r in ranks)
    except (ValueError, SyntaxError, TypeError):
        return []


def _group_table(dumps: dict[int, dict[str, Any]],
                 infos: dict[int, dict[str, Any]]) -> tuple[dict[str, dict], list[str]]:
    """Every process group's description and members: from the dumps' own tables when usable, the
    dumping ranks' tables, else from which ranks' entries name the group."""
    table: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for dump in dumps.values():
        for name, config in (dump.get("pg_config") or {}).items():
            ranks = _ranks_of(config.get("ranks")) if isinstance(config, dict) else []
            if name and ranks:
                table.setdefault(str(name), {"desc": config.get("desc", "undefined"), "ranks": ranks})
    for info in infos.values():
        for name, config in (info.get("process_groups") or {}).items():
            table.setdefault(str(name), {"desc": config.get("desc", "undefined"),
                                         "ranks": sorted(config["ranks"])})
    world = max([info.get("world_size") or 0 for info in infos.values()] + [max(dumps) + 1])
    for dump in dumps.values():
        for entry in dump["entries"]:
            name, desc = entry["process_group"]
            if str(name) in table:
                continue
            members = sorted(r for r, d in dumps.items()
                             if any(e["process_group"][0] == name for e in d["entries"]))
            if desc == "default_pg":
                members = list(range(world))
            notes.append(f"process group {name} ({desc}): members not recorded; taken as ranks {members}")
            table[str(name)] = {"desc": desc, "ranks": members}
    return table, notes


def normalise_dumps(dumps: dict[int, dict[str, Any]],
                    infos: dict[int, dict[str, Any]]) -> tuple[dict[int, dict], list[str]]:
    """The dumps with a process-group table PyTorch's analyzer can read, and what was assumed."""
    table, notes = _group_table(dumps, infos)
    out = {}
    for rank, dump in dumps.items():
        groups = {name for name, config in table.items() if rank in config["ranks"]}
        groups |= {str(e["process_group"][0]) for e in dump["entries"]}
        fixed = dict(dump)
        fixed["pg_config"] = {
            name: {"name": name, "desc": table[name]["desc"], "ranks": str(table[name]["ranks"])}
            for name in sorted(groups)
        }
        out[rank] = fixed
    return out, notes


def _pytorch_analyzer() -> tuple[Any, Any, Any]:
    """PyTorch's analyzer (``build_db``, ``JobConfig``, ``read_dir``), imported quietly: it warns on
    stderr at import when the optional ``tabulate`` is missing."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            from torch.distributed.flight_recorder.components.builder import build_db
            from torch.distributed.flight_recorder.components.config_manager import JobConfig
            from torch.distributed.flight_recorder.components.loader import read_dir
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("torch.distributed.flight_recorder"):
            raise  # something else is missing: not a torch too old
        raise TraceError(needs(HANG_FEATURE)) from None
    return build_db, JobConfig, read_dir


@contextlib.contextmanager
def _captured_analyzer_log() -> Iterator[list[str]]:
    """PyTorch's analyzer reports on its 'Flight Recorder' logger: keep the lines, print nothing."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    fr_logger = logging.getLogger("Flight Recorder")
    saved, propagate = fr_logger.handlers[:], fr_logger.propagate
    fr_logger.handlers, fr_logger.propagate = [Keep()], False
    try:
        yield lines
    finally:
        fr_logger.handlers, fr_logger.propagate = saved, propagate


def _run_pytorch_analyzer(dumps: dict[int, dict], prefix: str, incomplete: bool) -> tuple[Any, list[str]]:
    """``(database, log lines)`` of ``torch.distributed.flight_recorder`` on the normalised dumps."""
    build_db, job_config, read_dir = _pytorch_analyzer()
    with tempfile.TemporaryDirectory(prefix="torchprof-hang-") as tmp, _captured_analyzer_log() as lines:
        for rank, dump in dumps.items():
            (Path(tmp) / f"{prefix}{rank}").write_bytes(pickle.dumps(dump))
        argv = [tmp, "--prefix", prefix] + (["--allow-incomplete-ranks"] if incomplete else [])
        args = job_config().parse_args(argv)
        try:
            details, version = read_dir(args)
            db = build_db(details, args, version)
        except (AssertionError, KeyError, ValueError) as exc:
            raise TraceError(f"PyTorch's flight-recorder analyzer failed on these dumps "
                             f"({type(exc).__name__}: {exc})") from None
    return db, lines


def _user_frames(frames: Any, limit: int = 8) -> list[str]:
    """``file:line in function`` of the recorded stack, innermost first, PyTorch's own frames left out."""
    shown = [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}" for f in frames or []
             if isinstance(f, dict) and "/torch/" not in str(f.get("filename", ""))]
    return shown[:limit]


def _seq(entry: dict[str, Any]) -> int:
    return entry["p2p_seq_id"] if entry.get("is_p2p") else entry["collective_seq_id"]


def _entry_view(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {"collective": entry.get("profiling_name"), "seq": _seq(entry),
            "pg": str(entry["process_group"][0]), "pg_desc": entry["process_group"][1],
            "input_sizes": entry.get("input_sizes"), "state": entry.get("state"),
            "frames": _user_frames(entry.get("frames"))}


def _in_group(dump: dict[str, Any], pg: str) -> list[dict[str, Any]]:
    return [e for e in dump["entries"] if str(e["process_group"][0]) == pg]


def _last_completed(dump: dict[str, Any], pg: str) -> dict[str, Any] | None:
    """The rank's last completed collective in group ``pg`` (its ``pg_status``, else its last entry)."""
    entries = _in_group(dump, pg)
    if not entries:
        return None
    status = (dump.get("pg_status") or {}).get(str(entries[-1].get("pg_id")), {})
    last = status.get("last_completed_collective")
    if isinstance(last, int) and last >= 0:
        found = [e for e in entries if not e.get("is_p2p") and e["collective_seq_id"] == last]
        if found:
            return found[-1]
    done = [e for e in entries if e.get("state") == "completed" or e.get("retired")]
    return done[-1] if done else None


def _findings(db: Any, dumps: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The collectives PyTorch's analyzer found not joined (or joined differently) by some ranks."""
    out = []
    for collective in db.collectives:
        missing = sorted(collective.missing_ranks or [])
        mismatched = {int(rank): str(found.type_of_mismatch)
                      for rank, found in (collective.mismatch_collectives or {}).items()}
        if not missing and not mismatched and collective.pass_check:
            continue
        pg = str(collective.group_id)
        joined = sorted(set(collective.expected_ranks) - set(missing) - set(mismatched))
        absent = {}
        for rank in missing + sorted(mismatched):
            dump = dumps.get(rank)
            in_group = _in_group(dump, pg) if dump else []
            absent[rank] = {
                "last_in_group": _entry_view(in_group[-1]) if in_group else None,
                "last_completed_in_group": _entry_view(_last_completed(dump, pg)) if dump else None,
                "last_recorded": _entry_view(dump["entries"][-1]) if dump and dump["entries"] else None,
                "mismatch": mismatched.get(rank), "dumped": dump is not None}
        out.append({"pg": pg, "pg_desc": collective.pg_desc, "collective": collective.collective_name,
                    "seq": collective.collective_seq_id, "p2p_seq": collective.p2p_seq_id,
                    "input_sizes": collective.input_sizes, "state": collective.collective_state,
                    "expected_ranks": sorted(collective.expected_ranks), "joined": joined,
                    "missing_ranks": missing, "mismatched_ranks": sorted(mismatched), "ranks": absent,
                    "frames": _user_frames(collective.collective_frames)})
    return out


def _status(dumps: dict[int, dict[str, Any]]) -> dict[str, dict[int, dict[str, int]]]:
    """Per process group and rank: last enqueued / started / completed collective (``pg_status``)."""
    table: dict[str, dict[int, dict[str, int]]] = {}
    for rank, dump in sorted(dumps.items()):
        names = {str(e.get("pg_id")): str(e["process_group"][0]) for e in dump["entries"]}
        for pg_id, status in (dump.get("pg_status") or {}).items():
            if isinstance(status, dict):
                table.setdefault(names.get(str(pg_id), f"id {pg_id}"), {})[rank] = {
                    key.removeprefix("last_").removesuffix("_collective"): value
                    for key, value in status.items()}
    return table


def analyse_dumps(path: str | Path) -> dict[str, Any]:
    """Every recorder's dumps under a directory through PyTorch's analyzer, and where each rank is.

    Args:
        path: the run's ``--torch-profile-dir``, its ``flight_recorder/`` or, where neither holds
            dumps or stacks, its ``debug_server/`` (the debug server's newest periodic dumps,
            :mod:`~torchprof_args.analysis.tools.debug_dumps`).

    Returns:
        The answer as plain data (``torchprof hang --json``): ``directory``, ``recorders`` (per
        backend: the collectives some ranks did not join, who waited, each missing rank's last
        collective, the ranks' status, when each rank issued its last collective (``last_issued_s``,
        on one clock: ``clock``, the hosts' clocks aligned at the recorder's records)), ``dumped``
        (why and when each rank dumped), ``where`` (the ranks grouped by their stacks, None without
        stacks) and ``stacks_problems``.

    Raises:
        TraceError: neither dumps nor stacks there, or dumps PyTorch's analyzer cannot read (without
            stacks to answer instead).
    """
    directory, by_backend, infos = find_dumps(path)
    stacks, problems = find_stacks(directory)
    raw_dumps: dict[str, dict[int, dict[str, Any]]] = {}
    if not by_backend and not stacks:  # a job that still hangs: its debug server's dumps, if any
        server = find_server_dumps(path)
        if server is None:
            names = ", ".join(p + "<rank>" for p in FLIGHT_RECORDER_PREFIXES.values())
            raise TraceError(f"{directory}: no flight-recorder dumps ({names}), no stacks "
                             "(stacks_rank<R>.json) and no debug-server dumps; run with "
                             "--torch-profile-flight-recorder N, --torch-profile-stacks or "
                             "--torch-profile-debug-server")
        directory, raw_dumps, stacks, infos = server.directory, server.recorders, server.stacks, server.infos
        problems += server.problems
    for backend, files in by_backend.items():
        raw_dumps[backend] = {rank: load_dump(file) for rank, file in sorted(files.items())}
    said = ("reason", "host", "pid", "time", "files")
    report: dict[str, Any] = {"directory": str(directory), "recorders": [],
                              "dumped": {rank: {k: info.get(k) for k in said}
                                         for rank, info in sorted(infos.items())}}
    for backend in ("nccl", "gloo"):
        raw = raw_dumps.get(backend)
        if not raw:
            continue
        dumps, notes = normalise_dumps(raw, infos)
        members = {r for dump in dumps.values() for config in dump["pg_config"].values()
                   for r in _ranks_of(config["ranks"])}
        missing_dumps = sorted(members - set(dumps))
        try:
            db, log = _run_pytorch_analyzer(dumps, FLIGHT_RECORDER_PREFIXES[backend],
                                            incomplete=bool(missing_dumps))
        except TraceError as err:
            if not stacks:
                raise
            problems.append(f"the {backend} flight-recorder dumps were not analysed: {err}")
            continue  # the stacks still say where each rank is
        clock = dump_clocks(dumps, infos)
        report["recorders"].append({
            "backend": backend, "ranks": sorted(dumps), "missing_dumps": missing_dumps,
            "version": str(next(iter(dumps.values())).get("version")), "findings": _findings(db, dumps),
            "matched": sum(1 for c in db.collectives if c.pass_check and not c.missing_ranks),
            "status": _status(dumps), "notes": notes, "pytorch_analyzer": log,
            "last": {rank: _entry_view(dump["entries"][-1])
                     for rank, dump in dumps.items() if dump["entries"]},
            "last_issued_s": last_issued(dumps, clock), "clock": msgspec.to_builtins(clock)})
    world = max([info.get("world_size") or 0 for info in infos.values()] or [0])
    report["where"] = where_ranks_are(stacks, report["recorders"], world) if stacks else None
    report["stacks_problems"] = problems
    return report
