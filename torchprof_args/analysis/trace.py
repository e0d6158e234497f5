"""Load a Kineto trace into compact per-event numpy columns.

Only what the analyses need is kept: for every complete (``ph: "X"``) event its start, duration,
interned name / category / thread ids, CUDA stream and correlation id (8 columns, ~40 bytes an
event), and the ``[memory]`` instant events' counters.  Everything else in the JSON is skipped by
the decoder without being materialised, so memory stays a small fraction of the file's size.
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchprof_args.analysis.errors import TraceError
from torchprof_args.analysis.reader import TraceStream


class _Args(msgspec.Struct, gc=False, frozen=True):
    stream: int = -1
    correlation: int = -1
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")


_NO_ARGS = _Args()
_NO_CAT = "\x00"  # a missing category (HTA drops such events)


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = _NO_CAT
    ts: float = math.nan
    dur: float = math.nan
    pid: int | str = 0
    tid: int | str = 0
    args: _Args = _NO_ARGS


class _LooseEvent(msgspec.Struct):
    """Same fields with any JSON type, for batches the typed decoder rejects."""

    ph: Any = ""
    name: Any = ""
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = 0
    tid: Any = 0
    args: Any = None


_typed = msgspec.json.Decoder(list[_Event], strict=False)
_loose = msgspec.json.Decoder(list[_LooseEvent], strict=False)


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _minus1(value: int | None) -> int:
    return -1 if value is None else value


def _int(value: Any) -> int | None:
    """HTA's rule for stream numbers: ``int(value)`` or nothing."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _tighten(event: _LooseEvent) -> _Event:
    args = event.args if isinstance(event.args, dict) else {}
    return _Event(
        ph=event.ph if isinstance(event.ph, str) else "",
        name=event.name if isinstance(event.name, str) else str(event.name),
        cat=event.cat if isinstance(event.cat, str) else (_NO_CAT if event.cat is None else str(event.cat)),
        ts=_nan(_num(event.ts)),
        dur=_nan(_num(event.dur)),
        pid=event.pid if isinstance(event.pid, (int, str)) else str(event.pid),
        tid=event.tid if isinstance(event.tid, (int, str)) else str(event.tid),
        args=_Args(
            stream=_minus1(_int(args.get("stream"))),
            correlation=_minus1(_int(args.get("correlation"))),
            total_allocated=_int(args.get("Total Allocated")),
            total_reserved=_int(args.get("Total Reserved")),
            device_type=_int(args.get("Device Type")),
            device_id=_int(args.get("Device Id")),
        ),
    )


def _decode_events(text: bytes) -> list[_Event]:
    """Typed fast path; a batch with unusual value types is decoded loosely and normalised."""
    try:
        return _typed.decode(text)
    except msgspec.ValidationError:
        return [_tighten(e) for e in _loose.decode(text)]


@dataclass
class Trace:
    """One rank's trace as columns.  ``names[name_id[i]]`` is event ``i``'s name, etc.

    Times are microseconds as written in the file (relative to ``baseTimeNanoseconds`` when the
    trace has one).  Complete events missing ``dur`` or ``cat`` are dropped, like HTA does.
    """

    path: Path
    metadata: dict[str, Any]
    names: list[str]
    cats: list[str]
    threads: list[tuple[Any, Any]]
    ts: np.ndarray
    dur: np.ndarray
    name_id: np.ndarray
    cat_id: np.ndarray
    thread_id: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    memory: dict[str, np.ndarray]
    n_events: int
    file_bytes: int
    uncompressed_bytes: int
    compressed: bool
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def rank(self) -> int | None:
        info = self.metadata.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) else None

    @property
    def world_size(self) -> int | None:
        info = self.metadata.get("distributedInfo")
        size = info.get("world_size") if isinstance(info, dict) else None
        return size if isinstance(size, int) else None

    @property
    def base_time_ns(self) -> int:
        base = self.metadata.get("baseTimeNanoseconds")
        return int(base) if isinstance(base, (int, float)) else 0


class _Columns:
    """Accumulates a trace's columns batch by batch (python lists -> numpy per batch)."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.threads: dict[tuple[Any, Any], int] = {}
        self.chunks: dict[str, list[np.ndarray]] = {
            k: [] for k in ("ts", "dur", "name_id", "cat_id", "thread_id", "stream", "corr")
        }
        self.mem: dict[str, list[int | float]] = {k: [] for k in ("ts", "allocated", "reserved", "device")}
        self.n_events = 0

    def add(self, events: list[_Event]) -> None:
        self.n_events += len(events)
        xs = [e for e in events if e.ph == "X"]
        if len(xs) != len(events):
            self._instants([e for e in events if e.name == "[memory]" and (e.ph == "i" or e.ph == "I")])
        if not xs:
            return
        names, cats, threads = self.names, self.cats, self.threads
        ts = np.array([e.ts for e in xs], dtype=np.float64)
        dur = np.array([e.dur for e in xs], dtype=np.float64)
        name_id = np.array([names.setdefault(e.name, len(names)) for e in xs], dtype=np.int32)
        cat_id = np.array([cats.setdefault(e.cat, len(cats)) for e in xs], dtype=np.int32)
        thread_id = np.array([threads.setdefault((e.pid, e.tid), len(threads)) for e in xs], dtype=np.int32)
        streams = [e.args.stream for e in xs]
        try:
            stream = np.array(streams, dtype=np.int32)
        except OverflowError:  # absurd stream numbers: clamp, they only need to be >= 0 or -1
            stream = np.clip(np.array(streams, dtype=np.int64), -1, 2**31 - 1).astype(np.int32)
        corr = np.array([e.args.correlation for e in xs], dtype=np.int64)
        keep = ~(np.isnan(ts) | np.isnan(dur))
        missing_cat = cats.get(_NO_CAT)
        if missing_cat is not None:
            keep &= cat_id != missing_cat
        ch = self.chunks
        for key, col in (
            ("ts", ts), ("dur", dur), ("name_id", name_id), ("cat_id", cat_id),
            ("thread_id", thread_id), ("stream", stream), ("corr", corr),
        ):
            ch[key].append(col if keep.all() else col[keep])

    def _instants(self, events: list[_Event]) -> None:
        for e in events:
            a = e.args
            if a.total_allocated is None and a.total_reserved is None:
                continue
            self.mem["ts"].append(0.0 if math.isnan(e.ts) else e.ts)
            self.mem["allocated"].append(a.total_allocated or 0)
            self.mem["reserved"].append(a.total_reserved or 0)
            dev_type = a.device_type if a.device_type is not None else 0
            dev_id = a.device_id if a.device_id is not None else -1
            self.mem["device"].append(dev_type * 65536 + (dev_id + 1))

    def column(self, key: str, dtype: Any) -> np.ndarray:
        parts = self.chunks.pop(key)
        if not parts:
            return np.zeros(0, dtype=dtype)
        out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return out.astype(dtype, copy=False)


#: inputs at least this large are decoded by worker processes when more than one core is free.
PARALLEL_MIN_BYTES = 48 << 20


class _WrongCut(Exception):
    pass


def _worker_batch(text: bytes) -> tuple[Any, ...] | None:
    """Decode and reduce one batch in a worker; ``None`` when the cut was not an event boundary."""
    gc.disable()
    try:
        events = _decode_events(text)
    except msgspec.DecodeError:
        return None
    cols = _Columns()
    cols.add(events)
    del events
    out = {k: (np.concatenate(v) if v else None) for k, v in cols.chunks.items()}
    return out, list(cols.names), list(cols.cats), list(cols.threads), cols.mem, cols.n_events


def _merge_batch(cols: _Columns, result: tuple[Any, ...]) -> None:
    arrays, names, cats, threads, mem, n_events = result
    cols.n_events += n_events
    for key in mem:
        cols.mem[key].extend(mem[key])
    if arrays["ts"] is None:
        return
    for key, local, table in (("name_id", names, cols.names), ("cat_id", cats, cols.cats), ("thread_id", threads, cols.threads)):
        lookup = np.array([table.setdefault(x, len(table)) for x in local], dtype=np.int32)
        arrays[key] = lookup[arrays[key]]
    for key, col in arrays.items():
        cols.chunks[key].append(col)


def _default_workers(path: Path, wanted: int) -> int:
    """How many of ``wanted`` workers make sense: 1 for small files and inside daemon processes."""
    import multiprocessing as mp

    try:
        size = path.stat().st_size
    except OSError:
        return 1
    if mp.current_process().daemon or size < PARALLEL_MIN_BYTES:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, wanted))


def _load_sequential(stream: TraceStream, cols: _Columns) -> None:
    for events in stream.batches(_decode_events):
        cols.add(events)
        del events


def _load_parallel(stream: TraceStream, cols: _Columns, workers: int) -> None:
    """Main process reads and cuts; workers decode and reduce; results merged in file order."""
    import multiprocessing as mp
    from collections import deque

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    with ctx.Pool(workers) as pool:
        pending: deque[Any] = deque()
        for text in stream.batches():
            pending.append(pool.apply_async(_worker_batch, (text,)))
            del text
            while len(pending) > workers + 1:
                _take(cols, pending.popleft().get())
        while pending:
            _take(cols, pending.popleft().get())


def _take(cols: _Columns, result: tuple[Any, ...] | None) -> None:
    if result is None:
        raise _WrongCut
    _merge_batch(cols, result)


def load_trace(path: str | Path, progress: bool = False, workers: int | None = None) -> Trace:
    """Read a ``.json`` / ``.json.gz`` Kineto trace into a :class:`Trace` (streaming, low memory).

    ``workers > 1`` decodes large files in that many processes (worth it on machines with free
    cores; on a busy 2-core box it is slower, so the default is 1).  Raises :class:`TraceError` (message names the file) for bad input.
    """
    path = Path(path)
    workers = 1 if workers is None else max(1, min(workers, _default_workers(path, workers)))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived objects: collections would only cost time
    try:
        stream = TraceStream(path, progress=progress, validate=workers == 1)
        cols = _Columns()
        if workers == 1:
            _load_sequential(stream, cols)
        else:
            try:
                _load_parallel(stream, cols, workers)
            except _WrongCut:  # an unusual layout fooled the fast cut: redo it validated
                stream = TraceStream(path, progress=progress)
                cols = _Columns()
                _load_sequential(stream, cols)
    except MemoryError:
        raise TraceError(f"{path}: out of memory while reading the trace") from None
    finally:
        if gc_was_enabled:
            gc.enable()
    cats = list(cols.cats)
    meta = stream.metadata
    if not isinstance(meta.get("distributedInfo", {}), dict):
        meta["distributedInfo"] = {}
    mem = {
        "ts": np.array(cols.mem["ts"], dtype=np.float64),
        "allocated": np.array(cols.mem["allocated"], dtype=np.int64),
        "reserved": np.array(cols.mem["reserved"], dtype=np.int64),
        "device": np.array(cols.mem["device"], dtype=np.int64),
    }
    return Trace(
        path=stream.path,
        metadata=meta,
        names=list(cols.names),
        cats=[c if c != _NO_CAT else "" for c in cats],
        threads=list(cols.threads),
        ts=cols.column("ts", np.float64),
        dur=cols.column("dur", np.float64),
        name_id=cols.column("name_id", np.int32),
        cat_id=cols.column("cat_id", np.int32),
        thread_id=cols.column("thread_id", np.int32),
        stream=cols.column("stream", np.int32),
        corr=cols.column("corr", np.int64),
        memory=mem,
        n_events=cols.n_events,
        file_bytes=stream.file_bytes,
        uncompressed_bytes=stream.uncompressed_bytes,
        compressed=stream.compressed,
    )
