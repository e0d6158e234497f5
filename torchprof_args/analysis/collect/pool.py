"""Many traces' results: from matching sidecars, else parsed, several traces at a time.

:func:`collect` is what ``torchprof summary | report | diff | diagnose`` run over their inputs:
each trace's sidecar when it matches (milliseconds), else the trace is parsed
(:func:`~.trace_results.parse_results`).  Traces under 32 MB are parsed by a pool of processes,
one trace each (a single small trace cannot keep two cores busy); larger ones one after the other,
each decoded by two processes (:func:`load_trace`).  A trace that cannot be read is reported and
skipped; the others go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchprof_args.analysis.collect.sidecar import sidecar_version, stored_parts
from torchprof_args.analysis.collect.trace_results import (
    PARTS,
    SUMMARY,
    Outcome,
    Part,
    TraceFailure,
    TraceResults,
    parse_results,
    read_stored,
    with_stored,
)
from torchprof_args.analysis.critical_path.reduced import RankPaths
from torchprof_args.analysis.decode import parallel
from torchprof_args.analysis.decode.reader import ProgressBar
from torchprof_args.analysis.diagnose.documents import RankDiagnosis
from torchprof_args.analysis.memory.categories import MemoryPart
from torchprof_args.analysis.summary import Summary
from torchprof_args.shared import formats

__all__ = ["Collected", "collect"]


@dataclass
class Collected:
    """Results in input order (None where the trace failed) and what it took."""

    results: list[TraceResults | None]
    errors: list[TraceFailure] = field(default_factory=list)
    from_sidecars: int = 0
    parsed: int = 0
    parsed_bytes: int = 0
    sidecars_written: int = 0
    parse_seconds: float = 0.0
    #: traces parsed because their sidecar is of another version (``formats.SIDECAR.version``), by version.
    other_versions: dict[int, int] = field(default_factory=dict)

    @property
    def summaries(self) -> list[Summary | None]:
        """Each trace's summary, in input order (None where it failed or was not asked for)."""
        return [r.summary if r is not None else None for r in self.results]

    @property
    def memory(self) -> list[tuple[str, MemoryPart]]:
        """(trace, memory part) of the traces that gave one (``MEMORY.if_stored()``: their sidecars')."""
        return [(str(r.path), r.memory) for r in self.results if r is not None and r.memory is not None]

    @property
    def paths(self) -> list[RankPaths]:
        """The reduced graphs of the traces that gave one, in input order."""
        return [r.critical_path for r in self.results if r is not None and r.critical_path is not None]

    @property
    def diagnoses(self) -> list[RankDiagnosis]:
        """The rank diagnoses of the traces that gave one, in input order."""
        return [r.diagnosis for r in self.results if r is not None and r.diagnosis is not None]


def _pooled(paths: list[str], parts: tuple[str, ...], top: int | None, write: bool, keep: bool,
            processes: int) -> Iterator[tuple[int, Outcome]]:
    """(index, outcome) for small traces, ``processes`` at a time, as they finish."""
    import multiprocessing as mp

    if processes <= 1 or len(paths) <= 1 or not parallel.can_fork(mp):
        for i, p in enumerate(paths):
            yield _pool_task((i, p, parts, top, write, keep))
        return
    chunk = max(1, min(8, len(paths) // (4 * processes)))  # fewer round trips, still balanced
    with mp.get_context("fork").Pool(processes) as pool:
        tasks = [(i, p, parts, top, write, keep) for i, p in enumerate(paths)]
        yield from pool.imap_unordered(_pool_task, tasks, chunksize=chunk)


def _pool_task(task: tuple[int, str, tuple[str, ...], int | None, bool, bool]) -> tuple[int, Outcome]:
    index, path, names, top, write, keep = task
    parts = [p for p in PARTS if p.name in names]
    return index, parse_results(path, parts, top=top, write=write, keep=keep)


def collect(files: list[Path], *, parts: Sequence[Part[Any]] = (SUMMARY,), top: int | None = 30,
            reparse: bool = False, write: bool = False, keep: bool = True, workers: int | None = None,
            progress: bool = False, on_parsed: Callable[[Path, Outcome], None] | None = None) -> Collected:
    """The results of ``files``: matching sidecars unless ``reparse``, else parsed.

    Args:
        files: trace files.
        parts: the parts asked for (:data:`~.trace_results.SUMMARY`, ``DIAGNOSIS``, optional ones
            such as ``MEMORY.if_stored()``); each sidecar is read once, for all of them.
        top: entries per top-N list of the summary (None: all).
        reparse: parse every trace even where a sidecar matches (optional parts still come from it).
        write: publish the parsed traces' sidecars.
        keep: keep the results (without: sidecar writing only; a matching sidecar is not read).
        workers: processes that parse (default: one small trace per CPU; two per large trace).
        progress: progress bars on a terminal.
        on_parsed: told of each parsed trace, ``(path, outcome)``.

    Returns:
        The :class:`Collected` results and counts.
    """
    out = Collected([None] * len(files))
    todo = _from_sidecars(files, out, parts, top, reparse, keep)
    if not todo:
        return out
    started = time.perf_counter()
    big = [i for i in todo if _is_big(files[i])]
    small = [i for i in todo if i not in set(big)]
    bar = _bar(len(todo), progress)
    for i in big:
        result = parse_results(files[i], parts, top=top, write=write, keep=keep, workers=workers,
                               progress=progress)
        _record(out, files[i], i, result, todo[i], bar, on_parsed)
    processes = workers if workers is not None else parallel.usable_cpus()
    names = tuple(p.name for p in parts if not p.optional)
    for j, result in _pooled([str(files[i]) for i in small], names, top, write, keep,
                             min(processes, len(small))):
        _record(out, files[small[j]], small[j], result, todo[small[j]], bar, on_parsed)
    if bar is not None:
        bar.close()
    out.parse_seconds = time.perf_counter() - started
    return out


def _from_sidecars(files: list[Path], out: Collected, parts: Sequence[Part[Any]], top: int | None,
                   reparse: bool, keep: bool) -> dict[int, dict[str, Any]]:
    """Fill ``out`` from the matching sidecars (only counted without ``keep``); the files left to
    parse, by index, each with the parts its sidecar kept (the optional ones are taken from there)."""
    todo: dict[int, dict[str, Any]] = {}
    for i, f in enumerate(files):
        if not keep:
            if not reparse and stored_parts(f) is not None:  # matches: its parts are not decoded
                out.from_sidecars += 1
            else:
                todo[i] = {}
        else:
            stored, complete = read_stored(f, parts, top, reparse)
            if complete:
                out.results[i] = TraceResults(f, **stored)
                out.from_sidecars += 1
            else:
                todo[i] = stored
        version = sidecar_version(f) if i in todo and not reparse else None
        if version is not None and version != formats.SIDECAR.version:
            out.other_versions[version] = out.other_versions.get(version, 0) + 1
    return todo


def _record(out: Collected, path: Path, index: int, result: Outcome, stored: dict[str, Any],
            bar: ProgressBar | None, on_parsed: Callable[[Path, Outcome], None] | None) -> None:
    out.results[index] = with_stored(result.results, stored)
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


def _bar(total: int, progress: bool) -> ProgressBar | None:
    if not progress or total < 2:
        return None
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: the pool forks after the bar exists
    # disable=None: no bar unless stderr is a terminal
    bar: ProgressBar = tqdm(total=total, unit="trace", desc="parsing traces", leave=False, disable=None)
    return bar
