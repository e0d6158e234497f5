"""Decoding one trace with several processes: range cuts, worker processes, ordered results.

An uncompressed file is cut at event boundaries found by reading a small window around every
``segment`` bytes (:func:`cut_points`); each worker process reads and decodes its ranges itself,
so no event text crosses a pipe.  A cut is trusted only because the range before it decodes as a
JSON array: starting from the true start of the array, a range that parses completely ends where
an event ends, so the next range starts at one.  A range that does not parse raises
:class:`WrongCut` and the loader redoes the file with the validated sequential reader.  Gzipped
files (and the last stretch of a plain one) are streamed: the parent reads the text and sends it.
Workers return columns through an unlinked temporary file, not the pipe.

Forking is only done from a process that runs no other thread (:func:`can_fork`).
"""

from __future__ import annotations

import gc
import os
import queue
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchprof_args.analysis.decode.columns import BATCH_COLUMNS, ColumnBatch, decode_columns
from torchprof_args.analysis.decode.reader import ProgressBar, TraceStream
from torchprof_args.errors import TraceError


# -- ranges -----------------------------------------------------------------------------------
class WrongCut(Exception):
    """A range did not decode as a JSON array: the fast cut was not at an event boundary."""


def decode_part(text: Any, comms: bool = False, memory: bool | None = None, flops: bool = False,
                memory_rows: bool = False) -> ColumnBatch:
    """Columns of one range or streamed text; :class:`WrongCut` when it is not a JSON array.

    ``memory``: whether the trace has ``[memory]`` events (:func:`has_memory_events`); None
    scans the decoded events for them: cheaper than searching the text first, because a
    substring search through event text runs at only about 0.5 GB/s where the tag is absent (for
    a streamed ``.json.gz`` trace it cost a tenth of the decoding) and where it is present the
    events are scanned anyway.
    ``memory_rows``: keep every ``[memory]`` event (:mod:`.memory_rows`).
    """
    try:
        return decode_columns(text, comms, True if memory is None else memory, flops, memory_rows)
    except msgspec.DecodeError:
        raise WrongCut from None


MEMORY_TAG = b'"[memory]"'


def has_memory_events(fd: int, start: int, metadata: dict[str, Any]) -> bool:
    """Whether an uncompressed trace holds ``[memory]`` events: torch.profiler says so in its
    metadata (``profile_memory``), else its first 8 MB of events tell (with profile_memory on,
    every allocation and free is one, so they are everywhere).  Deciding once per file spares
    a search of every range (~4 ms per 8 MB)."""
    if metadata.get("profile_memory"):
        return True
    return MEMORY_TAG in os.pread(fd, 8 << 20, start)


def read_range(fd: int, offset: int, length: int) -> bytearray:
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


_CUT_WINDOW = 256 << 10


def cut_points(fd: int, start: int, size: int, segment: int) -> list[int]:
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


#: A task: (offset, length) of a range of an uncompressed file, or (-1, len) with the text itself.
Task = tuple[int, int, Any]


def plan_tasks(stream: TraceStream, fd: int | None, start: int | None, segment: int) -> Iterator[Task]:
    """Ranges of an uncompressed file (then its last stretch streamed), or streamed texts."""
    resume = None
    if fd is not None and start is not None:
        size = os.fstat(fd).st_size
        cuts = cut_points(fd, start, size, segment)
        begin = start
        for cut in cuts:
            yield begin, cut + 1 - begin, None
            begin = cut + 2  # after the "},"
        resume = begin
    for text in stream.batches(start=resume):
        yield -1, len(text), text


# -- worker processes -------------------------------------------------------------------------
def _worker_main(conn: Any, path: str, out_fd: int, comms: bool = False, memory: bool | None = None,
                 flops: bool = False, memory_rows: bool = False) -> None:
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
            text = read_range(fd, offset, length) if offset >= 0 else conn.recv_bytes()
            try:
                part = decode_part(text, comms, memory if offset >= 0 else None, flops, memory_rows)
            except WrongCut:
                conn.send(("bad", index))
                continue
            del text
            where, written = _write_columns(out_fd, part, written)
            conn.send(("ok", index, part.n_events, where, part.keys, part.memory, part.comms, part.flops,
                       part.memory_rows, part.compiled_args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("err", f"{type(exc).__name__}: {exc}"))
    finally:
        os.close(fd)


def _write_columns(out_fd: int, part: ColumnBatch, written: int) -> tuple[list[tuple[int, int, str]], int]:
    """Write ``part``'s arrays to ``out_fd`` from offset ``written``: (offset, length, dtype) of
    each, and the new end offset."""
    where = []
    for name, _ in BATCH_COLUMNS:
        data = getattr(part, name)
        where.append((written, len(data), data.dtype.str))
        view = data.data.cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(out_fd, view[done:], written + done)
        written += len(view)
    return where, written


def _read_column(fd: int, offset: int, n: int, dtype: str) -> np.ndarray:
    """The array :func:`_write_columns` wrote at ``offset``."""
    arr = np.empty(n, dtype=np.dtype(dtype))
    view = arr.data.cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise TraceError("a trace decoding worker's output could not be read back")
        done += got
    return arr


class Worker:
    """One forked worker, fed by a thread so a large text never blocks the main process."""

    def __init__(self, ctx: Any, path: Path, out_fd: int, comms: bool = False,
                 memory: bool | None = None, flops: bool = False, memory_rows: bool = False) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main,
                                args=(child_conn, str(path), out_fd, comms, memory, flops, memory_rows),
                                daemon=True)
        self.proc.start()
        child_conn.close()
        self.out_fd = out_fd
        self.outstanding = 0
        self.feed: queue.Queue[Any] = queue.Queue()
        self.feeder: threading.Thread | None = None

    def start_feeder(self) -> None:
        """Start the sending thread (after every worker is forked: forking copies no thread)."""
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
        """Queue task ``index``: a range to read (``text`` None) or a text to decode."""
        self.outstanding += 1
        self.feed.put((index, offset, length, text))

    def receive(self, block: bool) -> tuple[int, ColumnBatch] | None:
        """The next finished task's (index, columns), or None when none is ready and not ``block``.

        Raises :class:`WrongCut` for a range that was not cut at an event boundary, and
        TraceError when the worker failed or died.
        """
        if not block and not self.conn.poll():
            return None
        try:
            msg = self.conn.recv()
        except EOFError:
            raise TraceError("a trace decoding worker process died unexpectedly (out of memory?)") from None
        if msg[0] == "err":
            raise TraceError(f"a trace decoding worker failed: {msg[1]}")
        if msg[0] == "bad":
            raise WrongCut
        _, index, n_events, where, keys, memory, comms, flops, memory_rows, compiled_args = msg
        self.outstanding -= 1
        col = {name: _read_column(self.out_fd, offset, n, dtype)
               for (name, _), (offset, n, dtype) in zip(BATCH_COLUMNS, where, strict=True)}
        return index, ColumnBatch(n_events, col["ts"], col["dur"], col["key"], col["stream"], col["corr"],
                                  keys, memory, comms, flops, memory_rows, compiled_args)

    def close(self) -> None:
        """Stop the feeder and the process (killed if it does not exit within 5 s)."""
        if self.feeder is not None and self.feeder.is_alive():
            self.feed.put(None)
            self.feeder.join(timeout=5)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


class _InOrder:
    """Parts handed to ``add`` in file order: a part that arrives early waits for the ones before
    it, so interned tables come out in order of first appearance."""

    def __init__(self, add: Callable[[ColumnBatch], None]) -> None:
        self.add = add
        self.waiting: dict[int, ColumnBatch] = {}
        self.next_index = 0

    def put(self, index: int, part: ColumnBatch) -> None:
        self.waiting[index] = part
        while self.next_index in self.waiting:
            self.add(self.waiting.pop(self.next_index))
            self.next_index += 1


def run_tasks(tasks: Iterator[Task], fd: int | None, children: list[Worker], bar: ProgressBar | None,
              add: Callable[[ColumnBatch], None], comms: bool = False, memory: bool | None = None,
              flops: bool = False, memory_rows: bool = False) -> None:
    """Decode every task, here or in a worker (each kept at most a few tasks ahead), and hand
    the parts to ``add`` in file order."""
    ordered = _InOrder(add)
    sizes: dict[int, int] = {}  # bytes of the tasks in workers, for the progress bar

    def take(child: Worker, block: bool) -> bool:
        got = child.receive(block)
        if got is None:
            return False
        ordered.put(*got)
        if bar is not None:
            bar.update(sizes.pop(got[0], 0))
        return True

    for index, (offset, length, text) in enumerate(tasks):
        for child in children:
            while child.outstanding and take(child, False):
                pass
        idle = min(children, key=lambda c: c.outstanding, default=None)
        if idle is not None and idle.outstanding < (_AHEAD if offset >= 0 else _AHEAD_STREAMED):
            sizes[index] = length
            idle.submit(index, offset, length, text)
            continue
        if text is None:  # a range of the file: plan_tasks makes ranges only with a file descriptor
            assert fd is not None
            text = read_range(fd, offset, length)
        part = decode_part(text, comms, memory if offset >= 0 else None, flops, memory_rows)
        del text
        ordered.put(index, part)
        if bar is not None:
            bar.update(length)
    for child in children:
        while child.outstanding:
            take(child, True)


#: tasks a worker may hold ahead of the main process: too few leave it idle while the main process
#: decodes; streamed texts (gzip) cost memory while queued, but there the main process also
#: decompresses and cuts, so the worker must take more than half of the decoding.
_AHEAD = 2
_AHEAD_STREAMED = 4


# -- when to use workers ---------------------------------------------------------------------
#: inputs at least this large (bytes on disk) are decoded by several processes by default.
PARALLEL_MIN_BYTES = 32 << 20
PARALLEL_MIN_GZIP_BYTES = 8 << 20


def default_workers(path: Path, compressed: bool, size: int) -> int:
    """2 processes for large files on a machine with 2+ usable cores, else 1.

    Never forks from a daemon process or one running other threads (a training job's publisher
    thread, say): forking a multi-threaded process can deadlock the child.
    """
    import multiprocessing as mp

    if size < (PARALLEL_MIN_GZIP_BYTES if compressed else PARALLEL_MIN_BYTES):
        return 1
    return 2 if can_fork(mp) and usable_cpus() >= 2 else 1


def can_fork(mp: types.ModuleType) -> bool:
    """Whether this process may fork workers (``mp`` is the :mod:`multiprocessing` module)."""
    return (
        "fork" in mp.get_all_start_methods()
        and not mp.current_process().daemon
        and threading.active_count() == 1
    )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
