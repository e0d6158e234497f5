"""``load_trace``: read a ``.json`` / ``.json.gz`` Kineto trace into a :class:`Trace`.

The file is read in batches (:class:`~torchprof_args.analysis.decode.reader.TraceStream`), each batch
decoded into columns (:mod:`torchprof_args.analysis.decode.columns`), here or in worker processes
(:mod:`torchprof_args.analysis.decode.parallel`), and the columns accumulated in fixed-size blocks
(:class:`ColumnStore`) that are released one by one as the final arrays are filled, so peak
memory stays close to the columns' real size.
"""

from __future__ import annotations

import gc
import mmap
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from torchprof_args.analysis.decode import parallel
from torchprof_args.analysis.decode.columns import (
    I32_MAX,
    I32_MIN,
    MEMORY_COLUMNS,
    ColumnBatch,
    decode_columns,
    reduce_memory,
)
from torchprof_args.analysis.decode.events import NO_CAT
from torchprof_args.analysis.decode.reader import ProgressBar, TraceStream, not_utf8
from torchprof_args.analysis.trace import CompiledArgs, MemoryRows, Trace
from torchprof_args.errors import TraceError

__all__ = ["BLOCK_EVENTS", "SEGMENT_BYTES", "load_trace", "release_memory_eagerly"]

#: uncompressed files are cut into ranges of about this many bytes.
SEGMENT_BYTES = 8 << 20


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


class ColumnStore:
    """Columns accumulated in fixed-size blocks, in file order; interns (name, cat, pid, tid)."""

    def __init__(self) -> None:
        self.keys: dict[tuple[Any, Any, Any, Any], int] = {}
        self.dtypes = {"ts": np.float64, "dur": np.float64, "key": np.int32, "stream": np.int32,
                       "corr": np.int32}
        self.blocks: dict[str, list[np.ndarray]] = {c: [] for c in self.dtypes}
        self.fill = BLOCK_EVENTS  # events in the last block (full: a new block is needed)
        self.total = 0
        self.n_events = 0
        self.memory: list[dict[str, np.ndarray]] = []
        self.comms: list[tuple[Any, ...]] = []
        self.flops: list[tuple[np.ndarray, np.ndarray]] = []
        self.memory_rows: list[MemoryRows] = []
        self.compiled_args: list[tuple[int, CompiledArgs]] = []

    def add(self, part: ColumnBatch) -> None:
        """Append one batch's columns (parts must come in file order)."""
        self.n_events += part.n_events
        if len(part.memory["device"]):
            self.memory.append(part.memory)
        self.comms += part.comms
        if len(part.memory_rows):
            self.memory_rows.append(part.memory_rows)
        if len(part.flops[0]):
            self.flops.append((part.flops[0] + self.total, part.flops[1]))
        if len(part.compiled_args):
            self.compiled_args.append((self.total, part.compiled_args))
        keys = self.keys
        part.key = np.array([keys.setdefault(k, len(keys)) for k in part.keys], dtype=np.int32)[part.key]
        if self.dtypes["corr"] == np.int32 and len(part.corr) and (
            int(part.corr.min()) < I32_MIN or int(part.corr.max()) > I32_MAX
        ):
            self._widen_corr()
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

    def _widen_corr(self) -> None:
        """Store correlation ids as int64 from now on (a part holds one beyond int32)."""
        self.dtypes["corr"] = np.int64
        self.blocks["corr"] = [b.astype(np.int64) for b in self.blocks["corr"]]
        if self.blocks["corr"]:  # keep the last block writable at full size
            last = _empty(BLOCK_EVENTS, np.int64)
            last[: self.fill] = self.blocks["corr"][-1][: self.fill]
            self.blocks["corr"][-1] = last

    def finish(self) -> dict[str, Any]:
        """The final columns; blocks are released one by one as they are copied."""
        names: dict[str, int] = {}
        cats: dict[str, int] = {}
        threads: dict[tuple[Any, Any], int] = {}
        tables = {
            "name_id": np.array([names.setdefault(k[0], len(names)) for k in self.keys], dtype=np.int32),
            "cat_id": np.array([cats.setdefault(k[1], len(cats)) for k in self.keys], dtype=np.int32),
            "thread_id": np.array([threads.setdefault((k[2], k[3]), len(threads)) for k in self.keys],
                                  dtype=np.int32),
        }
        sizes = [BLOCK_EVENTS] * (len(self.blocks["ts"]) - 1) + [self.fill] if self.total else []
        out: dict[str, Any] = self._id_columns(tables, sizes)
        for col in ("ts", "dur", "stream", "corr"):
            out[col] = self._column(col, sizes)
        rows = {col: np.concatenate([m[col] for m in self.memory]) if self.memory else np.zeros(0, dtype)
                for col, dtype in MEMORY_COLUMNS}
        out["memory"] = reduce_memory(rows["device"], rows["peak_allocated"], rows["peak_reserved"],
                                      rows["samples"])
        out["n_events"] = self.n_events
        out["memory_rows"] = MemoryRows.concat(self.memory_rows)
        self.memory_rows = []
        out["comms"] = self.comms
        out["flops"] = (np.concatenate([f[0] for f in self.flops]) if self.flops else np.zeros(0, np.int64),
                        np.concatenate([f[1] for f in self.flops]) if self.flops else np.zeros(0))
        out["compiled_args"] = CompiledArgs.concat(self.compiled_args)
        out["names"], out["cats"], out["threads"] = list(names), list(cats), list(threads)
        out["name_cat"] = _first_categories(tables["name_id"], tables["cat_id"], len(names))
        return out

    def _id_columns(self, tables: dict[str, np.ndarray], sizes: list[int]) -> dict[str, np.ndarray]:
        """``name_id``, ``cat_id``, ``thread_id`` of every event (``tables`` maps each interned
        key to them), releasing the key blocks as they are read."""
        finals = {c: _empty(self.total, np.int32) for c in tables}
        o = 0
        blocks = self.blocks.pop("key")
        for size in sizes:
            block = blocks.pop(0)
            for col, table in tables.items():
                np.take(table, block[:size], out=finals[col][o : o + size])
            o += size
            del block
        return finals

    def _column(self, col: str, sizes: list[int]) -> np.ndarray:
        """Column ``col`` in one array, releasing its blocks as they are copied."""
        blocks = self.blocks.pop(col)
        final = _empty(self.total, self.dtypes[col])
        o = 0
        for size in sizes:
            block = blocks.pop(0)
            final[o : o + size] = block[:size]
            o += size
            del block
        return final


def _first_categories(name_id: np.ndarray, cat_id: np.ndarray, n_names: int) -> np.ndarray:
    """Each name's category (of its first key): a few hundred keys, not millions of events."""
    name_cat = np.zeros(n_names, dtype=np.int32)
    seen: set[int] = set()
    for name, cat in zip(name_id.tolist(), cat_id.tolist(), strict=True):
        if name not in seen:
            seen.add(name)
            name_cat[name] = cat
    return name_cat


def load_trace(path: str | Path, progress: bool = False, workers: int | None = None,
               comms: bool = False, flops: bool = False, memory_rows: bool = False) -> Trace:
    """Read a ``.json`` / ``.json.gz`` Kineto trace into a :class:`~torchprof_args.analysis.trace.Trace`
    (streaming, low memory: ~36 bytes an event kept).

    Args:
        path: the trace file.
        progress: a progress bar for files of 64 MB and more (on a terminal).
        workers: decoding processes (default: 2 for files over 32 MB, 8 MB gzipped, when two cores
            are usable, else 1).
        comms: also keep the communication events' fields in ``Trace.comms``
            (:mod:`~torchprof_args.analysis.decode.comm_events`; decoding is ~17 % slower).
        flops: keep the FLOP counts of the events that have one (``Trace.flops``).
        memory_rows: keep every ``[memory]`` event (``Trace.memory_rows``).

    Returns:
        The trace as columns.

    Raises:
        TraceError: the file is missing, not a trace, corrupt or truncated (the message names it).
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
            store = ColumnStore()
            stream = _load_fast(path, progress, workers, store, comms, flops, memory_rows)
        except parallel.WrongCut:  # an unusual layout fooled the fast cuts: redo it validated, in order
            store = ColumnStore()
            stream = TraceStream(path, progress=progress)
            for part in stream.batches(lambda text: decode_columns(text, comms, True, flops, memory_rows)):
                store.add(part)
                del part
        columns = store.finish()
        del store
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: {not_utf8(exc)}") from None
    except TraceError as exc:  # a decoding worker's error does not know the file
        if str(exc).startswith(str(path)):
            raise
        raise TraceError(f"{path}: {exc}") from None
    except MemoryError:
        raise TraceError(f"{path}: out of memory while reading the trace") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    finally:
        if gc_was_enabled:
            gc.enable()
    return _to_trace(stream, columns, comms, flops, memory_rows)


def _to_trace(stream: TraceStream, columns: dict[str, Any], comms: bool = False,
              flops: bool = False, memory_rows: bool = False) -> Trace:
    """The :class:`Trace` of a file read by ``stream`` (its metadata) into ``columns``."""
    meta = stream.metadata
    if not isinstance(meta.get("distributedInfo", {}), dict):
        meta["distributedInfo"] = {}
    return Trace(
        path=stream.path,
        metadata=meta,
        names=columns["names"],
        cats=[c if c != NO_CAT else "" for c in columns["cats"]],
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
        name_cat=columns["name_cat"],
        comms=columns["comms"] if comms else None,
        flops=columns["flops"] if flops else None,
        memory_rows=columns["memory_rows"] if memory_rows else None,
        compiled_args=columns["compiled_args"],
    )


def _load_fast(path: Path, progress: bool, workers: int | None, store: ColumnStore,
               comms: bool = False, flops: bool = False, memory_rows: bool = False) -> TraceStream:
    """Fill ``store`` from ``path`` (ranges of a plain file, else streamed batches), with worker
    processes when asked or when the file is large; returns the stream that read the metadata.

    Raises :class:`~torchprof_args.analysis.decode.parallel.WrongCut` when a range cut was wrong.
    """
    size = path.stat().st_size
    probe = TraceStream(path)
    start = probe.events_offset()  # None for gzip and unusual layouts
    workers = _worker_count(path, workers, probe.compressed, size)
    own_bar = progress and start is not None and size >= (64 << 20)
    stream = TraceStream(path, progress=progress and not own_bar, validate=False)
    if start is not None:
        stream.metadata.update(probe.metadata)
    with ExitStack() as stack:
        fd = memory = None
        if start is not None:
            fd = os.open(path, os.O_RDONLY)
            stack.callback(os.close, fd)
            memory = parallel.has_memory_events(fd, start, probe.metadata)
        children = _start_workers(stack, path, workers, comms, memory, flops, memory_rows)
        bar = _progress_bar(stack, path, size) if own_bar else None  # after forking: tqdm has a thread
        tasks = parallel.plan_tasks(stream, fd, start, SEGMENT_BYTES)
        parallel.run_tasks(tasks, fd, children, bar, store.add, comms, memory, flops, memory_rows)
    if start is not None:
        stream.uncompressed_bytes = size
    return stream


def _worker_count(path: Path, workers: int | None, compressed: bool, size: int) -> int:
    """The decoding processes for this file: as asked (1 where this process may not fork), else
    :func:`~torchprof_args.analysis.decode.parallel.default_workers`."""
    import multiprocessing as mp

    if workers is None:
        return parallel.default_workers(path, compressed, size)
    return 1 if workers > 1 and not parallel.can_fork(mp) else workers


def _start_workers(stack: ExitStack, path: Path, workers: int, comms: bool,
                   memory: bool | None, flops: bool = False,
                   memory_rows: bool = False) -> list[parallel.Worker]:
    """``workers - 1`` forked decoding processes (this one decodes too), closed by ``stack``."""
    if workers <= 1:
        return []
    import multiprocessing as mp

    scratch = stack.enter_context(tempfile.TemporaryFile(prefix="torchprof-columns-"))  # noqa: SIM115
    ctx = mp.get_context("fork")
    children = []
    for _ in range(workers - 1):
        child = parallel.Worker(ctx, path, scratch.fileno(), comms, memory, flops, memory_rows)
        stack.callback(child.close)
        children.append(child)
    for child in children:
        child.start_feeder()
    return children


def _progress_bar(stack: ExitStack, path: Path, size: int) -> ProgressBar:
    """A byte progress bar over the file, closed by ``stack``."""
    from tqdm import tqdm

    bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", leave=False, disable=None)
    stack.callback(bar.close)
    return bar
