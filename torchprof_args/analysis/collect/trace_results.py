"""One trace's results: from its sidecar when it matches, else by parsing the trace once.

Every tool that needs something computed from a whole trace goes through here: ``torchprof summary
| report | diff``, ``diagnose``, ``collectives``, ``critical-path``, ``mem``, the publisher (every
part, into the sidecar) and the decorator's operator tables.  A result is a :class:`Part`.  The
trace is decoded once, with what every part asked for needs; its sidecar is read once, for every
part asked for.  A trace that fails is a :class:`TraceFailure`, one line in the commands' output.

Adding a part (e.g. a critical-path summary): a field of :class:`TraceResults`, a :class:`Part` with
its compute function, appended to :data:`PARTS`.  A part computed elsewhere (the memory breakdown
by PyTorch's profiler, in the exporter) reaches the sidecar through ``parse_results(given=...)``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec

from torchprof_args.analysis.collect.sidecar import stored_parts, trace_fingerprint, write_sidecar
from torchprof_args.analysis.critical_path.reduced import RankPaths, rank_paths
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.diagnose.documents import RankDiagnosis
from torchprof_args.analysis.diagnose.rank import rank_diagnosis
from torchprof_args.analysis.memory.categories import MemoryPart
from torchprof_args.analysis.memory.trace_memory import trace_memory_part
from torchprof_args.analysis.summary import Summary, summarize, truncate
from torchprof_args.analysis.trace import Trace
from torchprof_args.errors import TraceError
from torchprof_args.naming import host_from_file_name, rank_from_file_name
from torchprof_args.shared import formats
from torchprof_args.time_limit import Deadline, TimeLimitExceeded, time_limit

__all__ = [
    "CRITICAL_PATH", "DIAGNOSIS", "MEMORY", "PARTS", "SUMMARY", "Failure", "Outcome", "Part", "TraceFailure",
    "TraceResults", "parse_results", "read_results", "read_stored", "results_of", "with_stored",
]

T = TypeVar("T")


@dataclass(frozen=True)
class TraceResults:
    """One trace's results; a part not asked for (or optional and not stored) is None.  The rank's
    parts have their rank from the file name when the trace does not state it.

    Attributes:
        path: the trace they describe.
        summary: what ``torchprof summary --json`` prints (its top-N lists cut as asked).
        diagnosis: the rank's part of ``torchprof diagnose`` (and ``collectives``' records).
        critical_path: the rank's reduced dependency graph (``critical-path``, ``diagnose``'s savings).
        memory: the trace's memory breakdown (``torchprof mem``).
    """

    path: Path
    summary: Summary | None = None
    diagnosis: RankDiagnosis | None = None
    critical_path: RankPaths | None = None
    memory: MemoryPart | None = None


def _with_rank(value: Any, top: int | None, path: Path) -> Any:
    """A rank's part as callers get it: its rank (and host, for a part that keeps one) from the file
    name when the trace does not state it."""
    if value.rank is None:
        value = msgspec.structs.replace(value, rank=rank_from_file_name(path.name))
    if "host" in value.__struct_fields__ and value.host is None:
        value = msgspec.structs.replace(value, host=host_from_file_name(path.name))
    return value


@dataclass(frozen=True)
class Part(Generic[T]):
    """One result of a trace.

    Attributes:
        name: its :class:`TraceResults` field and its key in the sidecar.
        document: its msgspec type: a stored value is decoded into it, with validation.
        format: the ``format`` a stored value must carry (another: an older or foreign part, the
            trace is parsed again); None: the type's validation alone (the summary: its content
            changes bump the sidecar's version).
        compute: ``(trace, top, path) -> value``: from the loaded trace (``top``: the summary's
            top-N lists, None for complete ones; ``path``: the trace the value describes).  Plain,
            finite values: what reading it back from the sidecar gives (a test compares them).
        finish: ``(value, top, path) -> value``: what a caller gets of a computed or read value
            (default: the rank from the file name where the value has none).
        comms, flops, memory_rows: whether computing it needs the trace's communication events, the
            operators' FLOPs (their input shapes), every ``[memory]`` event.
        optional: taken only where the sidecar keeps it, in the same read as the other parts: its
            absence (not computed, left out, unusable) never sends the trace to be parsed, and parsing
            the trace does not compute it (None then).  :meth:`if_stored` makes one.
    """

    name: str
    document: type[T]
    format: int | None
    compute: Callable[[Trace, int | None, Path], T]
    finish: Callable[[T, int | None, Path], T] = _with_rank
    comms: bool = False
    flops: bool = False
    memory_rows: bool = False
    optional: bool = False

    def if_stored(self) -> Part[T]:
        """This part, optional: where a sidecar keeps it (``diagnose``'s memory parts)."""
        return replace(self, optional=True)


def _finish_summary(summary: Summary, top: int | None, path: Path) -> Summary:
    return truncate(msgspec.structs.replace(summary, file=str(path)), top)


SUMMARY = Part("summary", Summary, None,
               lambda trace, top, path: msgspec.structs.replace(summarize(trace, top=top), file=str(path)),
               _finish_summary)
DIAGNOSIS = Part("diagnosis", RankDiagnosis, formats.DIAGNOSIS.version,
                 lambda trace, top, path: rank_diagnosis(trace), comms=True, flops=True)
CRITICAL_PATH = Part("critical_path", RankPaths, formats.PATHS.version,
                     lambda trace, top, path: rank_paths(trace), comms=True)
MEMORY = Part("memory", MemoryPart, formats.MEMORY.version, lambda trace, top, path: trace_memory_part(trace),
              memory_rows=True, comms=True)
#: every part, in the sidecar's key order (a sidecar holds them all).
PARTS: tuple[Part[Any], ...] = (SUMMARY, DIAGNOSIS, CRITICAL_PATH, MEMORY)


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _read(part: Part[T], stored: msgspec.Raw | None) -> T | None:
    """``part``'s value kept in a sidecar; None when missing, null (the publisher could not compute
    it, or left it out), not its document or of another format."""
    decoder = _decoders.get(part.document) or _decoders.setdefault(part.document,
                                                                  msgspec.json.Decoder(part.document | None))
    try:
        value = None if stored is None else decoder.decode(stored)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return value if part.format is None or getattr(value, "format", None) == part.format else None


class Failure(enum.Enum):
    """Why an input gave no results (or its sidecar was not written)."""

    INVALID = "invalid"  # not a trace the tools read: the reason is the TraceError's line, naming it
    UNREADABLE = "cannot be read"  # the file (permissions, gone)
    NO_SIDECAR = "cannot write its sidecar"  # the results came all the same
    NO_TRACES = "no traces"  # in the inputs (`torchprof mem`: no error when it read snapshots or metrics)


@dataclass(frozen=True)
class TraceFailure:
    """One input that failed; ``str()`` is the one line the commands print."""

    kind: Failure
    path: Path | None
    reason: str

    def __str__(self) -> str:
        if self.kind in (Failure.UNREADABLE, Failure.NO_SIDECAR):
            return f"{self.path}: {self.kind.value} ({self.reason})"
        return self.reason


class Outcome(NamedTuple):
    """What getting one trace's results gave."""

    #: the results; None when the trace failed or none were to be kept.
    results: TraceResults | None
    #: why the trace failed, or why its sidecar could not be written.
    error: TraceFailure | None
    #: bytes of trace JSON parsed (uncompressed); 0 when read from the sidecar or unreadable.
    parsed_bytes: int
    #: whether the trace's sidecar was written.
    sidecar_written: bool
    #: whether the results came from the sidecar.
    from_sidecar: bool = False
    #: the parts left out of the sidecar, each with why (over the analysis budget).
    left_out: Mapping[str, str] = {}  # noqa: RUF012 - a NamedTuple's default, never mutated


def read_stored(path: str | os.PathLike[str], parts: Sequence[Part[Any]], top: int | None = 30,
                reparse: bool = False) -> tuple[dict[str, Any], bool]:
    """The ``parts`` the sidecar of ``path`` keeps, in one read (``top``: the summary's top-N lists;
    ``reparse``: the optional parts only, the others are to be parsed).

    Returns:
        The usable parts' values by name (finished), and whether they are complete: every part
        that is not optional was usable (False without a matching sidecar, or with ``reparse``).
    """
    path = Path(path)
    wanted = [p for p in parts if p.optional or not reparse]
    stored = stored_parts(path) if wanted else None
    if stored is None:
        return {}, False
    values: dict[str, Any] = {}
    complete = not reparse
    for part in wanted:
        value = _read(part, stored.get(part.name))
        if value is not None:
            values[part.name] = part.finish(value, top, path)
        elif not part.optional:
            complete = False
    return values, complete


def read_results(path: str | os.PathLike[str], parts: Sequence[Part[Any]], top: int | None = 30
                 ) -> TraceResults | None:
    """The trace's results from its sidecar (:func:`read_stored`); None when there is no matching
    sidecar or it lacks a usable part that is not optional (then parse)."""
    values, complete = read_stored(path, parts, top)
    return TraceResults(Path(path), **values) if complete else None


def with_stored(results: TraceResults | None, stored: Mapping[str, Any]) -> TraceResults | None:
    """Parsed ``results`` completed with the parts its sidecar kept (the optional ones)."""
    if results is None or not stored:
        return results
    return replace(results, **{k: v for k, v in stored.items() if getattr(results, k) is None})


def parse_results(path: str | os.PathLike[str], parts: Sequence[Part[Any]], *, top: int | None = 30,
                  write: bool = False, keep: bool = True, workers: int | None = 1, progress: bool = False,
                  describes: Path | None = None, target: Path | None = None,
                  given: Mapping[str, Callable[[Trace], Any]] | None = None,
                  budget: Deadline | None = None) -> Outcome:
    """Parse one trace once and compute its results.

    Args:
        path: the trace file to parse.
        parts: the parts asked for (decoding needs only what they need, unless ``write``); optional
            ones are not computed (only by ``write``, for the sidecar).
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
    asked = {p.name for p in parts if not p.optional}
    computed = PARTS if write else tuple(p for p in parts if not p.optional)
    deadline = budget or Deadline(None)
    left_out: dict[str, str] = {}
    try:
        fingerprint = trace_fingerprint(described)
        trace = load_trace(path, progress=progress, workers=workers, comms=any(p.comms for p in computed),
                           flops=any(p.flops for p in computed),
                           memory_rows=any(p.memory_rows for p in computed))
        trace.path = described  # what lies beside the trace (compiled_modules/) is the published one's
        size = trace.uncompressed_bytes
        made, kept_top = given or {}, None if write else top
        values = {p.name: _computed(p, trace, kept_top, described, made.get(p.name))
                  for p in computed if p.name in asked}
        for p in computed:
            if p.name not in asked:
                values[p.name], why = _budgeted(p, trace, kept_top, described, deadline, made.get(p.name))
                if why:
                    left_out[p.name] = why
        values = {p.name: values[p.name] for p in computed}  # the sidecar's key order
        del trace
    except TraceError as exc:
        return Outcome(None, TraceFailure(Failure.INVALID, path, str(exc)), 0, False)
    except OSError as exc:
        return Outcome(None, TraceFailure(Failure.UNREADABLE, path, exc.strerror or str(exc)), 0, False)
    error = None
    if write:
        try:
            write_sidecar(described, values, fingerprint, target, left_out=left_out)
        except OSError as exc:
            error = TraceFailure(Failure.NO_SIDECAR, described, exc.strerror or str(exc))
    if not keep:
        return Outcome(None, error, size, write and error is None, left_out=left_out)
    results = TraceResults(described, **{p.name: p.finish(values[p.name], top, described) for p in parts
                                          if values.get(p.name) is not None})
    return Outcome(results, error, size, write and error is None, left_out=left_out)


def _computed(part: Part[T], trace: Trace, top: int | None, path: Path,
              given: Callable[[Trace], Any] | None = None) -> T:
    """``part`` of ``trace`` (from ``given`` when the part was computed elsewhere)."""
    return given(trace) if given is not None else part.compute(trace, top, path)


def _budgeted(part: Part[T], trace: Trace, top: int | None, path: Path, deadline: Deadline,
              given: Callable[[Trace], Any] | None) -> tuple[T | None, str | None]:
    """A part only the sidecar wants, within what is left of ``deadline``: (value, None), or (None,
    why) when it did not fit or failed (the parts asked for must not be lost to one only stored)."""
    if deadline.passed():
        return None, f"not started: {deadline.what} was spent"
    try:
        with time_limit(deadline.left()):
            return _computed(part, trace, top, path, given), None
    except TimeLimitExceeded:
        deadline.spend()  # the parts after it are not started
        return None, f"stopped: it ran past {deadline.what}"
    except Exception as err:  # noqa: BLE001 - one line in the sidecar, the trace published all the same
        return None, f"failed: {type(err).__name__}: {err}"


def results_of(path: str | os.PathLike[str], parts: Sequence[Part[Any]], *, top: int | None = 30,
               reparse: bool = False, write: bool = False, workers: int | None = None,
               progress: bool = False) -> Outcome:
    """One trace's results: from its matching sidecar (unless ``reparse``), else parsed.

    Args:
        path: the trace.
        parts: the parts asked for.
        top: entries per top-N list of the summary (None: all).
        reparse: parse even where the sidecar matches (the optional parts still come from it).
        write: when parsed, publish the sidecar too.
        workers: decoding processes (``load_trace``'s).
        progress: a progress bar while decoding.

    Returns:
        The :class:`Outcome`.
    """
    stored, complete = read_stored(path, parts, top, reparse)
    if complete:
        return Outcome(TraceResults(Path(path), **stored), None, 0, False, from_sidecar=True)
    outcome = parse_results(path, parts, top=top, write=write, workers=workers, progress=progress)
    return outcome._replace(results=with_stored(outcome.results, stored))
