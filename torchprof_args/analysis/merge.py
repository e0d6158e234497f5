"""Merge per-rank traces into one timeline with readable ``rank N`` process tracks.

Clocks are aligned with each file's ``baseTimeNanoseconds`` (Kineto writes ``ts`` relative to it),
process ids are remapped so ranks never collide (``rank N: <original name>`` process names,
sorted by rank), and flow ids are made unique per rank.  Every event of every rank is kept.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
from pathlib import Path
from typing import Any

import msgspec

from torchprof_args.analysis.reader import TraceStream, _gzip_impl, is_gzip
from torchprof_args.atomic import partial_path
from torchprof_args.errors import TraceError

_any = msgspec.json.Decoder()
_BASE_RE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_RANK_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_RANK_FILE_RE = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(directory: str | Path) -> list[Path]:
    """The traces of a directory (sorted); TraceError when there are none.

    torch.profiler's ``*.pt.trace.json[.gz]`` files when there are any (a run directory also holds
    other JSON, e.g. wandb's), else every ``.json`` / ``.json.gz`` file.  Hidden files (such as
    traces still being published) are skipped.
    """
    from torchprof_args.trace_writer import TRACE_SUFFIX

    directory = Path(directory)
    if not directory.is_dir():
        raise TraceError(f"{directory}: not a directory")
    candidates = sorted(p for p in directory.iterdir()
                        if p.is_file() and not p.name.startswith(".") and p.name.endswith(TRACE_SUFFIXES))
    profiler_traces = [p for p in candidates if TRACE_SUFFIX in p.name]
    files = profiler_traces or candidates
    if not files:
        raise TraceError(f"{directory}: no .json or .json.gz trace files in this directory")
    return files


def peek(path: Path) -> tuple[int | None, int]:
    """(rank, baseTimeNanoseconds) without parsing the events: the head and the last 256 KiB."""
    head, tail = b"", b""
    opener = _gzip_impl.open if is_gzip(path) else open
    try:
        with opener(path, "rb") as fh:  # type: ignore[operator]
            head = fh.read(1 << 20)
            tail = head[-(256 << 10) :]
            while True:
                data = fh.read(8 << 20)
                if not data:
                    break
                tail = (tail + data)[-(256 << 10) :]
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: cannot read ({exc})") from None
    rank = _RANK_RE.search(head)
    base = _BASE_RE.search(tail) or _BASE_RE.search(head)
    return (int(rank.group(1)) if rank else None), (int(base.group(1)) if base else 0)


def merge_traces(directory: str | Path, output: str | Path, progress: bool = False) -> dict[str, Any]:
    """Write the merged trace to ``output`` (``.gz`` compresses); returns counts per rank."""
    files = trace_files(directory)
    infos = [(f, *peek(f)) for f in files]
    ranks: list[int] = []
    for i, (f, rank, _) in enumerate(infos):
        if rank is None:
            m = _RANK_FILE_RE.search(f.name)
            rank = int(m.group(1)) if m else i
        ranks.append(rank)
    if len(set(ranks)) != len(ranks):
        ranks = list(range(len(files)))
    order = sorted(range(len(files)), key=lambda i: ranks[i])
    bases = [b for _, _, b in infos]
    base0 = min(bases)
    n = len(files)
    output = Path(output)
    tmp = partial_path(output)
    compress = output.name.endswith(".gz")
    fh: Any = _gzip_impl.open(tmp, "wb", compresslevel=3) if compress else open(tmp, "wb")  # noqa: SIM115
    counts: dict[int, int] = {}
    first_meta: dict[str, Any] = {}
    try:
        fh.write(b'{"schemaVersion": 1, "traceEvents": [\n')
        first = True
        for slot, i in enumerate(order):
            rank = ranks[i]
            shift_us = (bases[i] - base0) / 1000.0
            pids: dict[Any, int] = {}
            named: set[int] = set()

            def new_pid(pid: Any, rank: int = rank, pids: dict[Any, int] = pids) -> int:
                if pid not in pids:
                    pids[pid] = (rank + 1) * 1_000_000 + len(pids)
                return pids[pid]

            stream = TraceStream(files[i], progress=progress)
            count = 0
            for events in stream.batches(_any.decode):
                out = []
                for e in events:
                    if not isinstance(e, dict):
                        continue
                    count += 1
                    pid = e.get("pid", 0)
                    e["pid"] = new_pid(pid)
                    if "ts" in e:
                        with contextlib.suppress(TypeError, ValueError):
                            e["ts"] = round(float(e["ts"]) + shift_us, 3)
                    if isinstance(e.get("id"), int):
                        e["id"] = e["id"] * n + slot
                    if e.get("ph") == "M":
                        args = e.get("args") if isinstance(e.get("args"), dict) else {}
                        if e.get("name") == "process_name":
                            e["args"] = {**args, "name": f"rank {rank}: {args.get('name', pid)}"}
                            named.add(e["pid"])
                        elif e.get("name") == "process_sort_index":
                            e["args"] = {**args, "sort_index": e["pid"]}
                    out.append(e)
                if out:
                    chunk = b",\n".join(msgspec.json.encode(e) for e in out)
                    fh.write(chunk if first else b",\n" + chunk)
                    first = False
            extra = []
            for pid, new in pids.items():
                if new not in named:
                    extra.append({"ph": "M", "name": "process_name", "pid": new, "tid": 0, "args": {"name": f"rank {rank}: pid {pid}"}})
                extra.append({"ph": "M", "name": "process_sort_index", "pid": new, "tid": 0, "args": {"sort_index": new}})
            if extra:
                chunk = b",\n".join(msgspec.json.encode(e) for e in extra)
                fh.write(chunk if first else b",\n" + chunk)
                first = False
            counts[rank] = count
            if not first_meta:
                first_meta = stream.metadata
        info = first_meta.get("distributedInfo") if isinstance(first_meta.get("distributedInfo"), dict) else {}
        tail = {
            "deviceProperties": first_meta.get("deviceProperties", []),
            "distributedInfo": {**info, "rank": None, "merged_ranks": sorted(counts)},
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base0,
            "traceName": str(output),
        }
        fh.write(b"\n], " + msgspec.json.encode(tail)[1:] + b"\n")
    except BaseException:
        fh.close()
        tmp.unlink(missing_ok=True)
        raise
    fh.close()
    os.replace(tmp, output)
    return {"ranks": counts, "files": [str(files[i]) for i in order], "output": str(output)}
