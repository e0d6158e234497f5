"""Merge per-rank traces into one timeline with readable ``rank N`` process tracks.

Clocks are aligned with each file's ``baseTimeNanoseconds`` (Kineto writes ``ts`` relative to it)
and, on several hosts, with each host's offset estimated at the collectives the ranks share
(:mod:`~torchprof_args.analysis.analyzers.clocks`: from the traces' sidecars, else parsed; the
offsets are written into the merged trace's ``torchprof_clock``), process ids are remapped so ranks
never collide (``rank N: <original name>`` process names, sorted by rank), and flow ids are made
unique per rank.  Every event of every rank is kept.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypedDict

import msgspec

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment
from torchprof_args.analysis.analyzers.clocks import align_clocks
from torchprof_args.analysis.collect.discover import traces_in
from torchprof_args.analysis.collect.pool import collect
from torchprof_args.analysis.collect.trace_results import DIAGNOSIS
from torchprof_args.analysis.decode.reader import GZIP_ERRORS, TraceStream, is_gzip, open_gzip
from torchprof_args.analysis.jsonout import ArrayWriter
from torchprof_args.atomic import atomic_output
from torchprof_args.errors import TraceError
from torchprof_args.naming import GZIP_SUFFIX, rank_from_file_name

_any = msgspec.json.Decoder()
_BASE_RE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_RANK_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')


def trace_files(directory: str | Path) -> list[Path]:
    """The traces directly in a directory (sorted,
    :func:`~torchprof_args.analysis.collect.discover.traces_in`); TraceError when there are none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TraceError(f"{directory}: not a directory")
    files = traces_in(directory)
    if not files:
        raise TraceError(f"{directory}: no .json or .json.gz trace files in this directory")
    return files


def peek(path: Path) -> tuple[int | None, int]:
    """(rank, baseTimeNanoseconds) without parsing the events: the head and the last 256 KiB."""
    head, tail = b"", b""
    try:
        with open_gzip(path) if is_gzip(path) else open(path, "rb") as fh:
            head = fh.read(1 << 20)
            tail = head[-(256 << 10) :]
            while True:
                data = fh.read(8 << 20)
                if not data:
                    break
                tail = (tail + data)[-(256 << 10) :]
    except OSError as exc:
        if not is_gzip(path):
            raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
        raise TraceError(f"{path}: the gzip stream is truncated or corrupt ({exc})") from None
    except GZIP_ERRORS as exc:
        raise TraceError(f"{path}: the gzip stream is truncated or corrupt ({exc})") from None
    rank = _RANK_RE.search(head)
    base = _BASE_RE.search(tail) or _BASE_RE.search(head)
    return (int(rank.group(1)) if rank else None), (int(base.group(1)) if base else 0)


class Merged(TypedDict):
    """What :func:`merge_traces` wrote: events per rank, the inputs in rank order, the output and the
    hosts' clocks (None: not aligned, ``align_clocks`` False)."""

    ranks: dict[int, int]
    files: list[str]
    output: str
    clock: ClockAlignment | None


def _clock(files: list[Path], ranks: list[int], progress: bool) -> ClockAlignment:
    """The hosts' clocks of the merged ranks, from their collectives (sidecars, else parsed)."""
    got = collect(files, parts=(DIAGNOSIS,), progress=progress)
    comms = [r.diagnosis.comms(rank) for r, rank in zip(got.results, ranks, strict=True)
             if r is not None and r.diagnosis is not None]
    return align_clocks(comms)


def merge_traces(inputs: str | Path | list[Path], output: str | Path,
                 progress: bool = False, align_clocks: bool = True) -> Merged:
    """Merge per-rank traces into one timeline (``.gz`` output compresses): clocks aligned, process ids
    remapped per rank, flow ids made unique, every event of every rank kept.

    Args:
        inputs: a directory of one cycle's traces, or the trace files.
        output: the merged trace.
        progress: progress bars while reading.
        align_clocks: whether the hosts' clocks are aligned at their collectives (one host: nothing
            to align).

    Returns:
        The :class:`Merged` record.

    Raises:
        TraceError: an input cannot be read, or a directory holds no traces.
    """
    files = list(inputs) if isinstance(inputs, list) else trace_files(inputs)
    infos = [peek(f) for f in files]
    ranks = _ranks(files, [rank for rank, _ in infos])
    order = sorted(range(len(files)), key=lambda i: ranks[i])
    bases = [base for _, base in infos]
    base0 = min(bases)
    clock = _clock(files, ranks, progress) if align_clocks and len(files) > 1 else None
    output = Path(output)
    counts: dict[int, int] = {}
    first_meta: dict[str, Any] = {}
    with atomic_output(output, "wb") as raw, _compressed(raw, output) as fh:
        fh.write(b'{"schemaVersion": 1, "traceEvents": [\n')
        writer = ArrayWriter(fh)
        for slot, i in enumerate(order):
            rank = _RankRewriter(ranks[i], slot, len(files), (bases[i] - base0) / 1000.0,
                                 _moved(clock, ranks[i], bases[i] / 1000.0))
            counts[ranks[i]], metadata = rank.copy(files[i], writer, progress)
            first_meta = first_meta or metadata
        fh.write(b"\n], " + msgspec.json.encode(_tail(first_meta, counts, base0, output, clock))[1:] + b"\n")
    return {"ranks": counts, "files": [str(files[i]) for i in order], "output": str(output), "clock": clock}


def _moved(clock: ClockAlignment | None, rank: int, base_us: float) -> Callable[[float], float] | None:
    """A rank's times (trace-relative us) -> what its host's clock offset adds (None: nothing)."""
    host = clock.host_of(rank) if clock is not None and clock.aligned else None
    if host is None or (host.offset_us == 0.0 and host.drift_us_per_s is None):
        return None
    return lambda ts: host.offset_at(ts + base_us)


def _ranks(files: list[Path], stated: list[int | None]) -> list[int]:
    """Each file's rank: its ``distributedInfo``, else its name, else its position; positions
    for all when two files claim the same rank."""
    ranks = []
    for i, (f, rank) in enumerate(zip(files, stated, strict=True)):
        if rank is None:
            rank = rank_from_file_name(f.name)
        ranks.append(i if rank is None else rank)
    return ranks if len(set(ranks)) == len(ranks) else list(range(len(files)))


def _compressed(raw: IO[bytes], output: Path) -> contextlib.AbstractContextManager[IO[bytes]]:
    """A gzip writer over ``raw`` when ``output`` ends in ``.gz``, else ``raw`` itself."""
    if output.name.endswith(GZIP_SUFFIX):
        return open_gzip(raw, "wb", compresslevel=3)
    return contextlib.nullcontext(raw)


def _tail(first_meta: dict[str, Any], counts: dict[int, int], base0: int, output: Path,
          clock: ClockAlignment | None) -> dict[str, Any]:
    """The merged trace's top-level fields: the first rank's devices, every merged rank, the hosts'
    clocks."""
    info = _dict_or_empty(first_meta.get("distributedInfo"))
    return {
        "deviceProperties": first_meta.get("deviceProperties", []),
        "distributedInfo": {**info, "rank": None, "merged_ranks": sorted(counts)},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base0,
        "traceName": str(output),
        "torchprof_clock": clock,
    }


def _dict_or_empty(value: object) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (a trace's odd metadata)."""
    return value if isinstance(value, dict) else {}


class _RankRewriter:
    """Rewrites one rank's events for the merged timeline.

    Process ids become ``(rank + 1) * 1_000_000 + k`` (unique across ranks, sorted by rank),
    ``ts`` is shifted by the rank's base time and its host's clock offset, flow ids are made unique
    (``id * n + slot``), and process names become ``rank N: <name>``.
    """

    def __init__(self, rank: int, slot: int, n_ranks: int, shift_us: float,
                 host_offset: Callable[[float], float] | None = None) -> None:
        self.rank, self.slot, self.n_ranks, self.shift_us = rank, slot, n_ranks, shift_us
        self.host_offset = host_offset
        self.pids: dict[Any, int] = {}
        self.named: set[int] = set()

    def copy(self, path: Path, writer: ArrayWriter, progress: bool) -> tuple[int, dict[str, Any]]:
        """Write every event of ``path``, then the process names it lacked; returns the event
        count and the file's metadata."""
        stream = TraceStream(path, progress=progress)
        count = 0
        for events in stream.batches(_any.decode):
            kept = [self.event(e) for e in events if isinstance(e, dict)]
            count += len(kept)
            writer.write(kept)
        writer.write(self.process_metadata())
        return count, stream.metadata

    def new_pid(self, pid: Any) -> int:
        if pid not in self.pids:
            self.pids[pid] = (self.rank + 1) * 1_000_000 + len(self.pids)
        return self.pids[pid]

    def event(self, e: dict[str, Any]) -> dict[str, Any]:
        """``e`` rewritten in place."""
        pid = e.get("pid", 0)
        e["pid"] = self.new_pid(pid)
        if "ts" in e:
            with contextlib.suppress(TypeError, ValueError):
                ts = float(e["ts"])
                moved = self.host_offset(ts) if self.host_offset is not None else 0.0
                e["ts"] = round(ts + self.shift_us + moved, 3)
        if isinstance(e.get("id"), int):
            e["id"] = e["id"] * self.n_ranks + self.slot
        if e.get("ph") == "M":
            args = _dict_or_empty(e.get("args"))
            if e.get("name") == "process_name":
                e["args"] = {**args, "name": f"rank {self.rank}: {args.get('name', pid)}"}
                self.named.add(e["pid"])
            elif e.get("name") == "process_sort_index":
                e["args"] = {**args, "sort_index": e["pid"]}
        return e

    def process_metadata(self) -> list[dict[str, Any]]:
        """A name for every process the rank's trace did not name, and a sort index for all."""
        extra: list[dict[str, Any]] = []
        for pid, new in self.pids.items():
            if new not in self.named:
                extra.append({"ph": "M", "name": "process_name", "pid": new, "tid": 0,
                              "args": {"name": f"rank {self.rank}: pid {pid}"}})
            extra.append({"ph": "M", "name": "process_sort_index", "pid": new, "tid": 0,
                          "args": {"sort_index": new}})
        return extra
