"""Load a Kineto trace into compact per-event numpy columns.

Only what the analyses need is kept: for every complete (``ph: "X"``) event its start, duration,
interned name / category / thread ids, CUDA stream and correlation id (~36 bytes an event), and
the ``[memory]`` instant events' counters.

Speed comes from doing no per-event Python work: events are decoded by ``msgspec`` into small
structs (a union tagged by ``ph``, so flow and metadata events are skipped without building their
fields), and every column is filled by C-level iteration (``np.fromiter`` over ``attrgetter``).
Names, categories and threads are interned together through one dict keyed by the
``(name, cat, pid, tid)`` tuple: a few hundred distinct keys cover millions of events.

Large files are decoded by two (or more) processes.  An uncompressed file is cut at event
boundaries found by reading a small window around every 8 MB mark; each process reads and decodes
its ranges itself, so no event text crosses a pipe.  A cut is trusted only because the range before
it decodes as a JSON array: starting from the true start of the array, a range that parses
completely ends where an event ends, so the next range starts at one (any failure falls back to
the validated sequential reader).  Workers return columns through an unlinked temporary file.
"""

from __future__ import annotations

import gc
import math
import mmap
import os
import queue
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from operator import attrgetter
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

from torchprof_args.analysis.errors import TraceError
from torchprof_args.analysis.reader import TraceStream

_NO_CAT = "\x00"  # a missing category (HTA drops such events)
_I32_MAX = 2**31 - 1
_I32_MIN = -(2**31)


class _Args(msgspec.Struct, gc=False, frozen=True):
    stream: int = -1
    correlation: int = -1


class _MemArgs(msgspec.Struct, gc=False, frozen=True):
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")


_NO_ARGS = _Args()
_NO_MEM = _MemArgs()


class _X(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event: the only kind the analyses time."""

    name: str = ""
    cat: str = _NO_CAT
    ts: float = math.nan
    dur: float = math.nan
    pid: int | str = 0
    tid: int | str = 0
    args: _Args = _NO_ARGS


class _Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    name: str = ""
    ts: float = math.nan
    args: _MemArgs = _NO_MEM


class _InstantUpper(_Instant, tag="I"):
    pass


# Every other Chrome-trace phase decodes to an empty struct: its fields are skipped, not built.
# An unknown phase (or a missing ``ph``) makes the typed decoder reject the batch, which is then
# decoded loosely (slower, same result).
_SKIPPED = tuple(
    msgspec.defstruct(f"_Skip{ord(ph)}", [], tag_field="ph", tag=ph, gc=False) for ph in "BEbnestfPNODMVvRcC()"
)
_INSTANTS = (_Instant, _InstantUpper)


class _Skipped:
    """What the loose path makes of events the analyses ignore."""


_SKIP = _Skipped()


class _LooseEvent(msgspec.Struct):
    """The same fields with any JSON type, for batches the typed decoder rejects."""

    ph: Any = ""
    name: Any = ""
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = 0
    tid: Any = 0
    args: Any = None


_typed = msgspec.json.Decoder(list[Union[(_X, *_INSTANTS, *_SKIPPED)]], strict=False)  # noqa: UP007
_loose = msgspec.json.Decoder(list[_LooseEvent], strict=False)
_loose_one = msgspec.json.Decoder(_LooseEvent, strict=False)
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])


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
    except (TypeError, ValueError, OverflowError):
        return None


def _tighten(event: _LooseEvent) -> Any:
    ph = event.ph
    args = event.args if isinstance(event.args, dict) else {}
    name = event.name if isinstance(event.name, str) else str(event.name)
    if ph == "X":
        return _X(
            name=name,
            cat=event.cat if isinstance(event.cat, str) else (_NO_CAT if event.cat is None else str(event.cat)),
            ts=_nan(_num(event.ts)),
            dur=_nan(_num(event.dur)),
            pid=event.pid if isinstance(event.pid, (int, str)) else str(event.pid),
            tid=event.tid if isinstance(event.tid, (int, str)) else str(event.tid),
            args=_Args(stream=_minus1(_int(args.get("stream"))), correlation=_minus1(_int(args.get("correlation")))),
        )
    if ph in ("i", "I") and name == "[memory]":
        return _Instant(
            name=name,
            ts=_nan(_num(event.ts)),
            args=_MemArgs(
                total_allocated=_int(args.get("Total Allocated")),
                total_reserved=_int(args.get("Total Reserved")),
                device_type=_int(args.get("Device Type")),
                device_id=_int(args.get("Device Id")),
            ),
        )
    return _SKIP


def _decode_events(text: Any) -> list[Any]:
    """Typed fast path; a batch with unusual values is decoded loosely and normalised.

    Raises ``msgspec.DecodeError`` only when ``text`` is not a JSON array (a wrong cut).
    """
    try:
        return _typed.decode(text)
    except msgspec.ValidationError:
        pass
    try:
        return [_tighten(e) for e in _loose.decode(text)]
    except msgspec.ValidationError:  # an element that is not an object: count it, use nothing
        out = []
        for raw in _raw_list.decode(text):
            try:
                out.append(_tighten(_loose_one.decode(raw)))
            except msgspec.ValidationError:
                out.append(_SKIP)
        return out


_get_ts = attrgetter("ts")
_get_dur = attrgetter("dur")
_get_key = attrgetter("name", "cat", "pid", "tid")
_get_args = attrgetter("args")
_get_stream = attrgetter("stream")
_get_corr = attrgetter("correlation")


@dataclass
class _Part:
    """One batch reduced to columns; ``key`` indexes ``keys``, its (name, cat, pid, tid) tuples."""

    n_events: int
    ts: np.ndarray
    dur: np.ndarray
    key: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    keys: list[tuple[Any, Any, Any, Any]]
    memory: list[tuple[float, int, int, int]]


_COLUMNS = (("ts", np.float64), ("dur", np.float64), ("key", np.int32), ("stream", np.int32), ("corr", np.int64))


def _int_column(args: list[Any], getter: Any, n: int) -> np.ndarray:
    try:
        return np.fromiter(map(getter, args), np.int64, n)
    except OverflowError:  # beyond int64: only the sign matters to the analyses
        return np.array([max(min(getter(a), 2**63 - 1), -(2**63)) for a in args], dtype=np.int64)


def _reduce(events: list[Any]) -> _Part:
    """Columns of one decoded batch, built without a Python-level loop over the events."""
    xs = [e for e in events if e.__class__ is _X]
    memory = _memory(events) if len(xs) != len(events) else []
    n = len(xs)
    ts = np.fromiter(map(_get_ts, xs), np.float64, n)
    dur = np.fromiter(map(_get_dur, xs), np.float64, n)
    # Intern (name, cat, pid, tid): each new key is stored with the index of its first event.
    first: dict[tuple[Any, Any, Any, Any], int] = {}
    first_index = np.fromiter(map(first.setdefault, map(_get_key, xs), count()), np.intp, n)
    keys = list(first)
    lut = np.empty(n, dtype=np.int32)
    lut[np.fromiter(first.values(), np.intp, len(keys))] = np.arange(len(keys), dtype=np.int32)
    key = lut[first_index]
    del first_index, lut, first
    args = list(map(_get_args, xs))
    del xs
    stream = _int_column(args, _get_stream, n)
    if n and (stream.max() > _I32_MAX or stream.min() < _I32_MIN):
        stream = np.clip(stream, -1, _I32_MAX)  # absurd stream numbers: only >= 0 or -1 matters
    stream = stream.astype(np.int32)
    corr = _int_column(args, _get_corr, n)
    del args
    keep = ~(np.isnan(ts) | np.isnan(dur))
    if any(k[1] == _NO_CAT for k in keys):
        keep &= ~np.array([k[1] == _NO_CAT for k in keys], dtype=bool)[key]
    if not keep.all():
        ts, dur, key, stream, corr = ts[keep], dur[keep], key[keep], stream[keep], corr[keep]
    return _Part(len(events), ts, dur, key, stream, corr, keys, memory)


def _memory(events: list[Any]) -> list[tuple[float, int, int, int]]:
    """(ts, allocated, reserved, device code) of the ``[memory]`` instant events."""
    out = []
    for e in events:
        if e.__class__ not in _INSTANTS or e.name != "[memory]":
            continue
        a = e.args
        if a.total_allocated is None and a.total_reserved is None:
            continue
        dev_type = a.device_type if a.device_type is not None else 0
        dev_id = a.device_id if a.device_id is not None else -1
        ts = 0.0 if math.isnan(e.ts) else e.ts
        out.append((ts, a.total_allocated or 0, a.total_reserved or 0, dev_type * 65536 + (dev_id + 1)))
    return out


class _WrongCut(Exception):
    """A range did not decode as a JSON array: the fast cut was not at an event boundary."""


def _decode_part(text: Any) -> _Part:
    try:
        events = _decode_events(text)
    except msgspec.DecodeError:
        raise _WrongCut from None
    return _reduce(events)


def _read_range(fd: int, offset: int, length: int) -> bytearray:
    """Bytes ``[offset, offset + length)`` of the file wrapped in ``[`` ``]`` (one copy, no concat)."""
    buf = bytearray(length + 2)
    buf[0], buf[-1] = 0x5B, 0x5D
    view = memoryview(buf)[1:-1]
    done = 0
    while done < length:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise TraceError(f"file shrank while being read (at byte {offset + done})")
        done += n
    return buf


#: uncompressed files are cut into ranges of about this many bytes.
SEGMENT_BYTES = 8 << 20
_CUT_WINDOW = 256 << 10


def _cut_points(fd: int, start: int, size: int, segment: int) -> list[int]:
    """Offsets of ``}`` closing an event near every ``segment`` bytes (validated later by decoding)."""
    cuts: list[int] = []
    pos = start + segment
    while pos < size - 2 * segment:
        lo = max(pos - _CUT_WINDOW, (cuts[-1] + 2) if cuts else start)
        window = os.pread(fd, pos - lo, lo)
        end = len(window)
        while True:
            hit = window.rfind(b"},", 0, end)
            if hit < 0:
                break
            if window[hit + 2 : hit + 66].lstrip(b" \t\r\n").startswith(b"{"):
                cuts.append(lo + hit)
                break
            end = hit
        pos += segment
    return cuts


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




# -- worker processes -------------------------------------------------------------------------
def _child_main(conn: Any, path: str, out_fd: int) -> None:
    """Worker loop: take (index, range or text), send back where its columns were written."""
    gc.disable()
    fd = os.open(path, os.O_RDONLY)
    written = 0
    try:
        while True:
            task = conn.recv()
            if task is None:
                break
            index, offset, length = task
            text = _read_range(fd, offset, length) if offset >= 0 else conn.recv_bytes()
            try:
                part = _decode_part(text)
            except _WrongCut:
                conn.send(("bad", index))
                continue
            del text
            where = []
            for name, _ in _COLUMNS:
                data = getattr(part, name)
                where.append((written, len(data), data.dtype.str))
                view = memoryview(data).cast("B")
                done = 0
                while done < len(view):
                    done += os.pwrite(out_fd, view[done:], written + done)
                written += len(view)
            conn.send(("ok", index, part.n_events, where, part.keys, part.memory))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("err", f"{type(exc).__name__}: {exc}"))
    finally:
        os.close(fd)


class _Child:
    """One forked worker, fed by a thread so a large text never blocks the main process."""

    def __init__(self, ctx: Any, path: Path, out_fd: int) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child_conn, str(path), out_fd), daemon=True)
        self.proc.start()
        child_conn.close()
        self.out_fd = out_fd
        self.outstanding = 0
        self.feed: queue.Queue[Any] = queue.Queue()
        self.feeder: threading.Thread | None = None

    def start_feeder(self) -> None:
        self.feeder = threading.Thread(target=self._send_loop, daemon=True)
        self.feeder.start()

    def _send_loop(self) -> None:
        try:
            while True:
                task = self.feed.get()
                if task is None:
                    self.conn.send(None)
                    return
                index, offset, length, text = task
                self.conn.send((index, offset, length))
                if text is not None:
                    self.conn.send_bytes(text)
        except OSError:  # the child died; the main loop reports it
            return

    def submit(self, index: int, offset: int, length: int, text: Any) -> None:
        self.outstanding += 1
        self.feed.put((index, offset, length, text))

    def receive(self, block: bool) -> tuple[int, _Part] | None:
        if not block and not self.conn.poll():
            return None
        try:
            msg = self.conn.recv()
        except EOFError:
            raise TraceError("a trace decoding worker process died unexpectedly (out of memory?)") from None
        if msg[0] == "err":
            raise TraceError(f"a trace decoding worker failed: {msg[1]}")
        if msg[0] == "bad":
            raise _WrongCut
        _, index, n_events, where, keys, memory = msg
        self.outstanding -= 1
        cols = []
        for offset, n, dtype in where:
            arr = np.empty(n, dtype=np.dtype(dtype))
            view = memoryview(arr).cast("B")
            done = 0
            while done < len(view):
                got = os.preadv(self.out_fd, [view[done:]], offset + done)
                if got <= 0:
                    raise TraceError("a trace decoding worker's output could not be read back")
                done += got
            cols.append(arr)
        return index, _Part(n_events, *cols, keys, memory)

    def close(self) -> None:
        if self.feeder is not None and self.feeder.is_alive():
            self.feed.put(None)
            self.feeder.join(timeout=5)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


# A task: (offset, length) of a range of an uncompressed file, or (-1, len) with the text itself.
_Task = tuple[int, int, Any]


def _run_tasks(tasks: Iterator[_Task], fd: int | None, children: list[_Child], bar: Any, store: _Store) -> None:
    """Decode every task, here or in a worker (each kept at most two tasks ahead).

    Parts are added to ``store`` in file order (a part that arrives early waits for the ones
    before it), so interned tables come out in order of first appearance.
    """
    parts: dict[int, _Part] = {}
    next_index = 0

    def flush() -> None:
        nonlocal next_index
        while next_index in parts:
            store.add(parts.pop(next_index))
            next_index += 1

    def take(child: _Child, block: bool) -> bool:
        got = child.receive(block)
        if got is None:
            return False
        parts[got[0]] = got[1]
        flush()
        if bar is not None:
            bar.update(sizes.pop(got[0], 0))
        return True

    sizes: dict[int, int] = {}
    for index, (offset, length, text) in enumerate(tasks):
        for child in children:
            while child.outstanding and take(child, False):
                pass
        idle = min(children, key=lambda c: c.outstanding, default=None)
        if idle is not None and idle.outstanding < 2:
            sizes[index] = length
            idle.submit(index, offset, length, text)
            continue
        if text is None:
            text = _read_range(fd, offset, length)  # type: ignore[arg-type]
        parts[index] = _decode_part(text)
        del text
        flush()
        if bar is not None:
            bar.update(length)
    for child in children:
        while child.outstanding:
            take(child, True)
    flush()


# -- assembling the columns -------------------------------------------------------------------
def _empty(n: int, dtype: Any) -> np.ndarray:
    """An uninitialised array in its own anonymous mapping.

    Pages count towards RSS only once written, and go back to the system as soon as the array is
    freed (malloc would keep freed blocks of this size in its heap), which keeps peak memory close
    to the columns' real size.
    """
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes < (1 << 20):
        return np.empty(n, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=n)


def release_memory_eagerly() -> bool:
    """Make glibc return every freed block of 1 MiB or more to the system at once (CLI use).

    By default glibc raises its mmap threshold after large frees, so the analyses' temporaries
    end up in a heap that does not shrink and peak RSS grows with each pass.  A process-wide
    setting: the ``torchprof`` commands call it; a library caller may choose to.  Returns whether
    it took effect (glibc only).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, 1 << 20))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


#: events per storage block while loading.
BLOCK_EVENTS = 1 << 20


class _Store:
    """Columns accumulated in fixed-size blocks, in file order; interns (name, cat, pid, tid)."""

    def __init__(self) -> None:
        self.keys: dict[tuple[Any, Any, Any, Any], int] = {}
        self.dtypes = {"ts": np.float64, "dur": np.float64, "key": np.int32, "stream": np.int32, "corr": np.int32}
        self.blocks: dict[str, list[np.ndarray]] = {c: [] for c in self.dtypes}
        self.fill = BLOCK_EVENTS  # events in the last block (full: a new block is needed)
        self.total = 0
        self.n_events = 0
        self.memory: list[tuple[float, int, int, int]] = []

    def add(self, part: _Part) -> None:
        self.n_events += part.n_events
        self.memory += part.memory
        keys = self.keys
        part.key = np.array([keys.setdefault(k, len(keys)) for k in part.keys], dtype=np.int32)[part.key]
        if self.dtypes["corr"] == np.int32 and len(part.corr) and (
            int(part.corr.min()) < _I32_MIN or int(part.corr.max()) > _I32_MAX
        ):
            self.dtypes["corr"] = np.int64
            self.blocks["corr"] = [b.astype(np.int64) for b in self.blocks["corr"]]
            if self.blocks["corr"]:  # keep the last block writable at full size
                last = _empty(BLOCK_EVENTS, np.int64)
                last[: self.fill] = self.blocks["corr"][-1][: self.fill]
                self.blocks["corr"][-1] = last
        n, done = len(part.ts), 0
        while done < n:
            if self.fill == BLOCK_EVENTS:
                for col, dtype in self.dtypes.items():
                    self.blocks[col].append(_empty(BLOCK_EVENTS, dtype))
                self.fill = 0
            step = min(n - done, BLOCK_EVENTS - self.fill)
            for col in self.dtypes:
                self.blocks[col][-1][self.fill : self.fill + step] = getattr(part, col)[done : done + step]
            self.fill += step
            done += step
        self.total += n

    def finish(self) -> dict[str, Any]:
        """The final columns; blocks are released one by one as they are copied."""
        names: dict[str, int] = {}
        cats: dict[str, int] = {}
        threads: dict[tuple[Any, Any], int] = {}
        tables = {
            "name_id": np.array([names.setdefault(k[0], len(names)) for k in self.keys], dtype=np.int32),
            "cat_id": np.array([cats.setdefault(k[1], len(cats)) for k in self.keys], dtype=np.int32),
            "thread_id": np.array([threads.setdefault((k[2], k[3]), len(threads)) for k in self.keys], dtype=np.int32),
        }
        out: dict[str, Any] = {}
        sizes = [BLOCK_EVENTS] * (len(self.blocks["ts"]) - 1) + [self.fill] if self.total else []
        finals = {c: _empty(self.total, np.int32) for c in tables}
        o = 0
        blocks = self.blocks.pop("key")
        for size in sizes:
            block = blocks.pop(0)
            for col, table in tables.items():
                np.take(table, block[:size], out=finals[col][o : o + size])
            o += size
            del block
        out.update(finals)
        for col in ("ts", "dur", "stream", "corr"):
            blocks = self.blocks.pop(col)
            final = _empty(self.total, self.dtypes[col])
            o = 0
            for size in sizes:
                block = blocks.pop(0)
                final[o : o + size] = block[:size]
                o += size
                del block
            out[col] = final
        memory = self.memory
        out["memory"] = {
            "ts": np.array([m[0] for m in memory], dtype=np.float64),
            "allocated": np.array([m[1] for m in memory], dtype=np.int64),
            "reserved": np.array([m[2] for m in memory], dtype=np.int64),
            "device": np.array([m[3] for m in memory], dtype=np.int64),
        }
        out["n_events"] = self.n_events
        out["names"], out["cats"], out["threads"] = list(names), list(cats), list(threads)
        return out


#: inputs at least this large (bytes on disk) are decoded by several processes by default.
PARALLEL_MIN_BYTES = 32 << 20
PARALLEL_MIN_GZIP_BYTES = 8 << 20


def _default_workers(path: Path, compressed: bool, size: int) -> int:
    """2 processes for large files on a machine with 2+ usable cores, else 1.

    Never forks from a daemon process or one running other threads (a training job's publisher
    thread, say): forking a multi-threaded process can deadlock the child.
    """
    import multiprocessing as mp

    if size < (PARALLEL_MIN_GZIP_BYTES if compressed else PARALLEL_MIN_BYTES):
        return 1
    return 2 if _can_fork(mp) and _cpus() >= 2 else 1


def _can_fork(mp: Any) -> bool:
    return (
        "fork" in mp.get_all_start_methods()
        and not mp.current_process().daemon
        and threading.active_count() == 1
    )


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _tasks(stream: TraceStream, fd: int | None, start: int | None, segment: int) -> Iterator[_Task]:
    """Ranges of an uncompressed file (then its last stretch streamed), or streamed texts."""
    resume = None
    if fd is not None and start is not None:
        size = os.fstat(fd).st_size
        cuts = _cut_points(fd, start, size, segment)
        begin = start
        for cut in cuts:
            yield begin, cut + 1 - begin, None
            begin = cut + 2  # after the "},"
        resume = begin
    for text in stream.batches(start=resume):
        yield -1, len(text), text


def load_trace(path: str | Path, progress: bool = False, workers: int | None = None) -> Trace:
    """Read a ``.json`` / ``.json.gz`` Kineto trace into a :class:`Trace` (streaming, low memory).

    ``workers`` processes decode the events (default: 2 for files over 32 MB, 8 MB gzipped, when
    two cores are usable, else 1).  Raises :class:`TraceError` (message names the file) for bad
    input.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, expected a .json or .json.gz trace file")
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived objects: collections would only cost time
    try:
        try:
            store = _Store()
            stream = _load_fast(path, progress, workers, store)
        except _WrongCut:  # an unusual layout fooled the fast cuts: redo it validated, in order
            store = _Store()
            stream = TraceStream(path, progress=progress)
            for events in stream.batches(_decode_events):
                store.add(_reduce(events))
                del events
        columns = store.finish()
        del store
    except MemoryError:
        raise TraceError(f"{path}: out of memory while reading the trace") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    finally:
        if gc_was_enabled:
            gc.enable()
    meta = stream.metadata
    if not isinstance(meta.get("distributedInfo", {}), dict):
        meta["distributedInfo"] = {}
    return Trace(
        path=stream.path,
        metadata=meta,
        names=columns["names"],
        cats=[c if c != _NO_CAT else "" for c in columns["cats"]],
        threads=columns["threads"],
        ts=columns["ts"],
        dur=columns["dur"],
        name_id=columns["name_id"],
        cat_id=columns["cat_id"],
        thread_id=columns["thread_id"],
        stream=columns["stream"],
        corr=columns["corr"],
        memory=columns["memory"],
        n_events=columns["n_events"],
        file_bytes=stream.file_bytes,
        uncompressed_bytes=stream.uncompressed_bytes,
        compressed=stream.compressed,
    )


def _load_fast(path: Path, progress: bool, workers: int | None, store: _Store) -> TraceStream:
    import multiprocessing as mp

    size = path.stat().st_size
    probe = TraceStream(path)
    start = probe.events_offset()  # None for gzip and unusual layouts
    compressed = probe.compressed
    if workers is None:
        workers = _default_workers(path, compressed, size)
    elif workers > 1 and not _can_fork(mp):
        workers = 1
    bar = None
    own_bar = progress and start is not None and size >= (64 << 20)
    stream = TraceStream(path, progress=progress and not own_bar, validate=False)
    if start is not None:
        stream.metadata.update(probe.metadata)
    fd = os.open(path, os.O_RDONLY) if start is not None else None
    children: list[_Child] = []
    scratch = None
    try:
        if workers > 1:
            scratch = tempfile.TemporaryFile(prefix="torchprof-columns-")  # noqa: SIM115 - closed below
            ctx = mp.get_context("fork")
            children = [_Child(ctx, path, scratch.fileno()) for _ in range(workers - 1)]
            for child in children:
                child.start_feeder()
        if own_bar:  # after forking: tqdm starts a monitor thread
            from tqdm import tqdm

            bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", leave=False)
        _run_tasks(_tasks(stream, fd, start, SEGMENT_BYTES), fd, children, bar, store)
    finally:
        for child in children:
            child.close()
        if scratch is not None:
            scratch.close()
        if fd is not None:
            os.close(fd)
        if bar is not None:
            bar.close()
    if start is not None:
        stream.uncompressed_bytes = size
    return stream
