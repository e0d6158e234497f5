"""One trace's results: from its sidecar when it matches, else by parsing the trace once.

Every tool that needs something computed from a whole trace goes through here: ``torchprof summary
| report | diff`` (the summary), ``diagnose`` (the rank's part of the diagnosis), the publisher (both,
into the sidecar, and the operator table) and the decorator's operator tables.  A result is a
:class:`Part`: its name (a field of :class:`TraceResults` and a key of the sidecar), what decoding
the trace needs for it (communication events, FLOPs), how it is computed from the loaded
:class:`~torchprof_args.analysis.trace.Trace` and how it is read back.  The trace is decoded once,
with what every part asked for needs; a sidecar holds every part.

Adding a part (e.g. a critical-path summary): a field of :class:`TraceResults`, a :class:`Part` with
its compute function, appended to :data:`PARTS`.  A part computed elsewhere (the memory breakdown
by PyTorch's profiler, in the exporter) reaches the sidecar through ``parse_results(given=...)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from torchprof_args.analysis.collect.sidecar import stored_parts, trace_fingerprint, write_sidecar
from torchprof_args.analysis.critical_path.reduced import PATHS_FORMAT, RankPaths, rank_paths
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.diagnose.documents import DIAGNOSIS_FORMAT, RankDiagnosis
from torchprof_args.analysis.diagnose.rank import rank_diagnosis
from torchprof_args.analysis.jsonout import finite
from torchprof_args.analysis.memory.categories import MEMORY_FORMAT, MemoryPart
from torchprof_args.analysis.memory.trace_memory import trace_memory_part
from torchprof_args.analysis.summary import Summary, decode_summary, summarize, truncate
from torchprof_args.analysis.trace import Trace
from torchprof_args.errors import TraceError
from torchprof_args.naming import rank_from_file_name
from torchprof_args.time_limit import Deadline, TimeLimitExceeded, time_limit

__all__ = [
    "CRITICAL_PATH", "DIAGNOSIS", "MEMORY", "PARTS", "SUMMARY", "Outcome", "Part", "TraceResults",
    "parse_results", "read_results", "results_of",
]


@dataclass(frozen=True)
class TraceResults:
    """One trace's results; a part not asked for is None.

    Attributes:
        path: the trace they describe.
        summary: what ``torchprof summary --json`` prints (its top-N lists cut as asked).
        diagnosis: the rank's part of ``torchprof diagnose`` (its rank from the file name when the
            trace does not state it).
        critical_path: the rank's reduced dependency graph (``torchprof critical-path``, and
            ``diagnose``'s savings); its rank from the file name when the trace does not state it.
        memory: the trace's memory breakdown (``torchprof mem``; its rank likewise).
    """

    path: Path
    summary: Summary | None = None
    diagnosis: RankDiagnosis | None = None
    critical_path: RankPaths | None = None
    memory: MemoryPart | None = None


@dataclass(frozen=True)
class Part:
    """One result of a trace.

    Attributes:
        name: its :class:`TraceResults` field and its key in the sidecar.
        comms: whether computing it needs the trace's communication events.
        flops: whether it needs the operators' FLOPs (their input shapes).
        compute: ``(trace, top, path) -> value``: from the loaded trace (``top``: the summary's
            top-N lists, None for complete ones; ``path``: the trace the value describes).
        read: ``(stored JSON) -> value``, None when the sidecar's is unusable (then parse).
        finish: ``(value, top, path) -> value``: what a caller gets of a computed or read value.
        memory_rows: whether it needs every ``[memory]`` event.
    """

    name: str
    comms: bool
    flops: bool
    compute: Callable[[Trace, int | None, Path], Any]
    read: Callable[[msgspec.Raw], Any]
    finish: Callable[[Any, int | None, Path], Any]
    memory_rows: bool = False


def _compute_summary(trace: Trace, top: int | None, path: Path) -> Summary:
    return msgspec.structs.replace(summarize(trace, top=top), file=str(path))


def _read_summary(stored: msgspec.Raw) -> Summary | None:
    return decode_summary(stored)  # null (not computed) fails validation: then the trace is parsed


def _finish_summary(summary: Summary, top: int | None, path: Path) -> Summary:
    return truncate(msgspec.structs.replace(summary, file=str(path)), top)


_encode = msgspec.json.Encoder()
_decode_diagnosis = msgspec.json.Decoder(RankDiagnosis)
_decode_stored_diagnosis = msgspec.json.Decoder(RankDiagnosis | None)


def _compute_diagnosis(trace: Trace, top: int | None, path: Path) -> RankDiagnosis:
    # as strict JSON and back, so that it is the same whether parsed now or read from a sidecar
    return _decode_diagnosis.decode(_encode.encode(finite(rank_diagnosis(trace))))


def _read_diagnosis(stored: msgspec.Raw) -> RankDiagnosis | None:
    part = _decode_stored_diagnosis.decode(stored)  # null: the publisher could not compute it
    return part if part is not None and part.format == DIAGNOSIS_FORMAT else None


def _finish_diagnosis(part: RankDiagnosis, top: int | None, path: Path) -> RankDiagnosis:
    if part.rank is None:
        return msgspec.structs.replace(part, rank=rank_from_file_name(path.name))
    return part


_decode_paths = msgspec.json.Decoder(RankPaths)
_decode_stored_paths = msgspec.json.Decoder(RankPaths | None)


def _compute_paths(trace: Trace, top: int | None, path: Path) -> RankPaths:
    return _decode_paths.decode(_encode.encode(finite(rank_paths(trace))))


def _read_paths(stored: msgspec.Raw) -> RankPaths | None:
    part = _decode_stored_paths.decode(stored)
    return part if part is not None and part.format == PATHS_FORMAT else None


def _finish_paths(part: RankPaths, top: int | None, path: Path) -> RankPaths:
    if part.rank is None:
        return msgspec.structs.replace(part, rank=rank_from_file_name(path.name))
    return part


def _compute_memory(trace: Trace, top: int | None, path: Path) -> MemoryPart:
    return trace_memory_part(trace)


_decode_stored_memory = msgspec.json.Decoder(MemoryPart | None)


def _read_memory(stored: msgspec.Raw) -> MemoryPart | None:
    part = _decode_stored_memory.decode(stored)  # null: the publisher could not compute it
    return part if part is not None and part.format == MEMORY_FORMAT else None


def _finish_memory(part: MemoryPart, top: int | None, path: Path) -> MemoryPart:
    if part.rank is None:
        return msgspec.structs.replace(part, rank=rank_from_file_name(path.name))
    return part


SUMMARY = Part("summary", comms=False, flops=False, compute=_compute_summary, read=_read_summary,
               finish=_finish_summary)
DIAGNOSIS = Part("diagnosis", comms=True, flops=True, compute=_compute_diagnosis, read=_read_diagnosis,
                 finish=_finish_diagnosis)
CRITICAL_PATH = Part("critical_path", comms=True, flops=False, compute=_compute_paths, read=_read_paths,
                     finish=_finish_paths)
MEMORY = Part("memory", comms=False, flops=False, compute=_compute_memory, read=_read_memory,
              finish=_finish_memory, memory_rows=True)
#: every part, in the sidecar's key order (a sidecar holds them all).
PARTS: tuple[Part, ...] = (SUMMARY, DIAGNOSIS, CRITICAL_PATH, MEMORY)


class Outcome(NamedTuple):
    """What getting one trace's results gave."""

    #: the results; None when the trace failed or none were to be kept.
    results: TraceResults | None
    #: one line naming the trace: why it failed, or why its sidecar could not be written.
    error: str | None
    #: bytes of trace JSON parsed (uncompressed); 0 when read from the sidecar or unreadable.
    parsed_bytes: int
    #: whether the trace's sidecar was written.
    sidecar_written: bool
    #: whether the results came from the sidecar.
    from_sidecar: bool = False
    #: the parts left out of the sidecar, each with why (over the analysis budget).
    left_out: Mapping[str, str] = {}  # noqa: RUF012 - a NamedTuple's default, never mutated


def read_results(path: str | os.PathLike[str], parts: Sequence[Part], top: int | None = 30
                 ) -> TraceResults | None:
    """The trace's results from its sidecar.

    Args:
        path: the trace.
        parts: the parts asked for.
        top: entries per top-N list of the summary (None: all).

    Returns:
        The results; None when there is no matching sidecar or it lacks a usable part (then parse).
    """
    path = Path(path)
    stored = stored_parts(path)
    if stored is None:
        return None
    values: dict[str, Any] = {}
    for part in parts:
        try:
            value = part.read(stored[part.name]) if part.name in stored else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            value = None
        if value is None:
            return None
        values[part.name] = part.finish(value, top, path)
    return TraceResults(path, **values)


def parse_results(path: str | os.PathLike[str], parts: Sequence[Part], *, top: int | None = 30,
                  write: bool = False, keep: bool = True, workers: int | None = 1, progress: bool = False,
                  describes: Path | None = None, target: Path | None = None,
                  given: Mapping[str, Callable[[Trace], Any]] | None = None,
                  budget: Deadline | None = None) -> Outcome:
    """Parse one trace once and compute its results.

    Args:
        path: the trace file to parse.
        parts: the parts asked for (decoding needs only what they need, unless ``write``).
        top: entries per top-N list of the summary (None: all).
        write: compute every part and publish them as the trace's sidecar first; a sidecar that
            cannot be written (read-only folder) is the outcome's error, the results still returned.
            A part computed only for the sidecar that fails is stored as null (readers then parse).
        keep: return the results (a sidecar-writing shard does not need them).
        workers: decoding processes (``load_trace``'s).
        progress: a progress bar while decoding.
        describes: the trace the results and the sidecar describe, when ``path`` is a copy of it
            (the publisher parses the staged copy of the published trace).
        target: where the sidecar goes (default: where readers look for ``describes``').
        given: parts computed elsewhere, by name: the function that makes the value from the loaded
            trace instead of the part's ``compute`` (the publisher's memory part, from what the
            exporter computed with the profiler's results).
        budget: when the decoding and the parts not asked for must be done (the publisher's share
            of ``--torch-profile-analysis-budget``, started before it decodes; None: no limit).  A
            part that does not fit (not started, or stopped by
            :func:`~torchprof_args.time_limit.time_limit`) is stored as null and named in the
            sidecar's ``left_out`` with the reason: readers then parse the trace for it.  The parts
            asked for are always computed.

    Returns:
        The :class:`Outcome`; a trace that cannot be read is its error, never an exception.
    """
    path = Path(path)
    described = describes or path
    computed = PARTS if write else tuple(parts)
    deadline = budget or Deadline(None)
    left_out: dict[str, str] = {}
    try:
        fingerprint = trace_fingerprint(described)
        trace = load_trace(path, progress=progress, workers=workers, comms=any(p.comms for p in computed),
                           flops=any(p.flops for p in computed),
                           memory_rows=any(p.memory_rows for p in computed))
        size = trace.uncompressed_bytes
        made, kept_top = given or {}, None if write else top
        values = {p.name: _computed(p, trace, kept_top, described, made.get(p.name))
                  for p in computed if p in parts}
        for p in computed:
            if p not in parts:
                values[p.name], why = _budgeted(p, trace, kept_top, described, deadline, made.get(p.name))
                if why:
                    left_out[p.name] = why
        values = {p.name: values[p.name] for p in computed}  # the sidecar's key order
        del trace
    except TraceError as exc:
        return Outcome(None, str(exc), 0, False)
    except OSError as exc:
        return Outcome(None, f"{path}: cannot be read ({exc.strerror or exc})", 0, False)
    error = None
    if write:
        try:
            write_sidecar(described, values, fingerprint, target, left_out=left_out)
        except OSError as exc:
            error = f"{described}: cannot write its sidecar ({exc.strerror or exc})"
    if not keep:
        return Outcome(None, error, size, write and error is None, left_out=left_out)
    results = TraceResults(described, **{p.name: p.finish(values[p.name], top, described) for p in parts})
    return Outcome(results, error, size, write and error is None, left_out=left_out)


def _computed(part: Part, trace: Trace, top: int | None, path: Path,
              given: Callable[[Trace], Any] | None = None) -> Any:
    """``part`` of ``trace`` (from ``given`` when the part was computed elsewhere)."""
    return given(trace) if given is not None else part.compute(trace, top, path)


def _budgeted(part: Part, trace: Trace, top: int | None, path: Path, deadline: Deadline,
              given: Callable[[Trace], Any] | None) -> tuple[Any, str | None]:
    """A part only the sidecar wants, within what is left of ``deadline``: (value, None), or (None,
    why) when it did not fit or failed (the parts asked for must not be lost to one only stored)."""
    if deadline.passed():
        return None, f"not started: {deadline.what} was spent"
    try:
        with time_limit(deadline.left()):
            return _computed(part, trace, top, path, given), None
    except TimeLimitExceeded:
        return None, f"stopped: it ran past {deadline.what}"
    except Exception as err:  # noqa: BLE001 - one line in the sidecar, the trace published all the same
        return None, f"failed: {type(err).__name__}: {err}"


def results_of(path: str | os.PathLike[str], parts: Sequence[Part], *, top: int | None = 30,
                  reparse: bool = False, write: bool = False, workers: int | None = None,
                  progress: bool = False) -> Outcome:
    """One trace's results: from its matching sidecar (unless ``reparse``), else parsed.

    Args:
        path: the trace.
        parts: the parts asked for.
        top: entries per top-N list of the summary (None: all).
        reparse: parse even where the sidecar matches.
        write: when parsed, publish the sidecar too.
        workers: decoding processes (``load_trace``'s).
        progress: a progress bar while decoding.

    Returns:
        The :class:`Outcome`.
    """
    if not reparse:
        found = read_results(path, parts, top)
        if found is not None:
            return Outcome(found, None, 0, False, from_sidecar=True)
    return parse_results(path, parts, top=top, write=write, workers=workers, progress=progress)
