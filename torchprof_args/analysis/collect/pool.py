"""Summaries of many traces: from matching sidecars, else parsed, several traces at a time.

:func:`collect` is what ``torchprof summary | report | diff`` run over their inputs: each trace's
sidecar when it matches (milliseconds), else the trace is parsed.  Traces under 32 MB are parsed
by a pool of processes, one trace each (a single small trace cannot keep two cores busy);
larger ones one after the other, each decoded by two processes (:func:`load_trace`).  A trace
that cannot be read is reported and skipped; the others go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from torchprof_args.analysis.collect.sidecar import (
    read_sidecar,
    sidecar_matches,
    trace_identity,
    truncate,
    write_sidecar,
)
from torchprof_args.analysis.decode import parallel
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.diagnose.job import rank_diagnosis
from torchprof_args.analysis.summary import finite, summarize
from torchprof_args.errors import TraceError

__all__ = ["Collected", "Parsed", "collect", "parse_one"]


@dataclass
class Collected:
    """Summaries in input order (None where the trace failed) and what it took."""

    summaries: list[dict[str, Any] | None]
    errors: list[str] = field(default_factory=list)
    from_sidecars: int = 0
    parsed: int = 0
    parsed_bytes: int = 0
    sidecars_written: int = 0
    parse_seconds: float = 0.0


class Parsed(NamedTuple):
    """What parsing one trace gave (:func:`parse_one`)."""

    #: the summary cut to ``top``; None when the trace failed or none was to be kept.
    summary: dict[str, Any] | None
    #: one line naming the trace: why it failed, or why its sidecar could not be written.
    error: str | None
    #: bytes of trace JSON parsed (uncompressed); 0 when the trace could not be read.
    parsed_bytes: int
    #: whether the trace's sidecar was written.
    sidecar_written: bool


def parse_one(path: str, top: int | None, write: bool, workers: int | None = 1, progress: bool = False,
              keep: bool = True) -> Parsed:
    """Parse one trace and summarise it.

    With ``write`` the complete summary is published as the trace's sidecar first; a sidecar
    that cannot be written (read-only folder) is reported as the error, the summary still returned.
    Without ``keep`` no summary is returned (a sidecar-writing shard does not need them).
    """
    trace_path = Path(path)
    try:
        identity = trace_identity(trace_path)
        trace = load_trace(trace_path, progress=progress, workers=workers, comms=write, flops=write)
        size = trace.uncompressed_bytes
        summary = finite(summarize(trace, top=None if write else top))
        diagnosis = finite(rank_diagnosis(trace)) if write else None
        del trace
    except TraceError as exc:
        return Parsed(None, str(exc), 0, False)
    except OSError as exc:
        return Parsed(None, f"{trace_path}: cannot be read ({exc.strerror or exc})", 0, False)
    if not write:
        return Parsed(summary, None, size, False)
    error = None
    try:
        write_sidecar(summary, trace_path, identity, diagnosis=diagnosis)
    except OSError as exc:
        error = f"{trace_path}: cannot write its sidecar ({exc.strerror or exc})"
    return Parsed(truncate(summary, top) if keep else None, error, size, error is None)


def _pooled(paths: list[str], top: int | None, write: bool, keep: bool,
            processes: int) -> Iterator[tuple[int, Parsed]]:
    """(index, parse_one result) for small traces, ``processes`` at a time, as they finish."""
    import multiprocessing as mp

    if processes <= 1 or len(paths) <= 1 or not parallel.can_fork(mp):
        for i, p in enumerate(paths):
            yield i, parse_one(p, top, write, keep=keep)
        return
    chunk = max(1, min(8, len(paths) // (4 * processes)))  # fewer round trips, still balanced
    with mp.get_context("fork").Pool(processes) as pool:
        tasks = [(i, p, top, write, keep) for i, p in enumerate(paths)]
        yield from pool.imap_unordered(_pool_task, tasks, chunksize=chunk)


def _pool_task(task: tuple[int, str, int | None, bool, bool]) -> tuple[int, Parsed]:
    index, path, top, write, keep = task
    return index, parse_one(path, top, write, keep=keep)


def collect(files: list[Path], *, top: int | None = 30, reparse: bool = False, write: bool = False,
            keep: bool = True, workers: int | None = None, progress: bool = False,
            on_parsed: Callable[[Path, Parsed], None] | None = None) -> Collected:
    """Summaries of ``files``: matching sidecars unless ``reparse``, else parsed (and, with
    ``write``, published as sidecars).  ``on_parsed(path, result)`` is told of each parsed trace.
    Without ``keep`` (sidecar writing only) no summary is kept, and a matching sidecar is not read.
    """
    out = Collected([None] * len(files))
    todo = _from_sidecars(files, out, top, reparse, keep)
    if not todo:
        return out
    started = time.perf_counter()
    big = [i for i in todo if _is_big(files[i])]
    small = [i for i in todo if i not in set(big)]
    bar = _bar(len(todo), progress)
    for i in big:
        result = parse_one(str(files[i]), top, write, workers, progress, keep)
        _record(out, files[i], i, result, bar, on_parsed)
    processes = workers if workers is not None else parallel.usable_cpus()
    for j, result in _pooled([str(files[i]) for i in small], top, write, keep, min(processes, len(small))):
        _record(out, files[small[j]], small[j], result, bar, on_parsed)
    if bar is not None:
        bar.close()
    out.parse_seconds = time.perf_counter() - started
    return out


def _from_sidecars(files: list[Path], out: Collected, top: int | None, reparse: bool,
                   keep: bool) -> list[int]:
    """Fill ``out`` from the matching sidecars (only counted without ``keep``); the indices of
    the files left to parse."""
    todo: list[int] = []
    for i, f in enumerate(files):
        if not keep:
            if not reparse and sidecar_matches(f):
                out.from_sidecars += 1
            else:
                todo.append(i)
            continue
        found = None if reparse else read_sidecar(f, top)
        if found is None:
            todo.append(i)
        else:
            out.summaries[i] = found
            out.from_sidecars += 1
    return todo


def _record(out: Collected, path: Path, index: int, result: Parsed, bar: Any,
            on_parsed: Callable[[Path, Parsed], None] | None) -> None:
    out.summaries[index] = result.summary
    out.parsed += result.parsed_bytes > 0
    out.parsed_bytes += result.parsed_bytes
    out.sidecars_written += result.sidecar_written
    if result.error:
        out.errors.append(result.error)
    if bar is not None:
        bar.update(1)
    if on_parsed is not None:
        on_parsed(path, result)


def _is_big(path: Path) -> bool:
    """Whether one trace is large enough for :func:`load_trace` to decode it with two processes."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            compressed = fh.read(2) == b"\x1f\x8b"
    except OSError:
        return False
    return size >= (parallel.PARALLEL_MIN_GZIP_BYTES if compressed else parallel.PARALLEL_MIN_BYTES)


def _bar(total: int, progress: bool) -> Any:
    if not progress or total < 2:
        return None
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: the pool forks after the bar exists
    # disable=None: no bar unless stderr is a terminal
    return tqdm(total=total, unit="trace", desc="parsing traces", leave=False, disable=None)

