"""The trace model: one rank's Kineto trace as compact per-event numpy columns, and its decoder.

Only what the analyses need is kept: for every complete (``ph: "X"``) event its start, duration,
interned name / category / thread ids, CUDA stream and correlation id (~36 bytes an event), and
the ``[memory]`` instant events' counters.

Speed comes from doing no per-event Python work: events are decoded by ``msgspec`` into small
structs (a union tagged by ``ph``, so flow and metadata events are skipped without building their
fields), and every column is filled by C-level iteration (``np.fromiter`` over ``attrgetter``).
Names, categories and threads are interned together through one dict keyed by the
``(name, cat, pid, tid)`` tuple: a few hundred distinct keys cover millions of events.

:func:`decode_events` and :func:`reduce_batch` turn one batch of event text into a :class:`Part`
(its columns); :mod:`torchprof_args.analysis.loader` assembles the parts of a file into a
:class:`Trace`, decoding in worker processes (:mod:`torchprof_args.analysis.parallel`) when the
file is large.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import count
from operator import attrgetter
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

__all__ = ["Trace"]

NO_CAT = "\x00"  # a missing category (HTA drops such events)
I32_MAX = 2**31 - 1
I32_MIN = -(2**31)


@dataclass
class Trace:
    """One rank's trace as columns.  ``names[name_id[i]]`` is event ``i``'s name, etc.

    Times are microseconds as written in the file (relative to ``baseTimeNanoseconds`` when the
    trace has one).  Complete events missing ``dur`` or ``cat`` are dropped, like HTA does.
    ``stream`` and ``corr`` are -1 where the event has none.  ``memory`` sums up the ``[memory]``
    events per device (``device`` code, ``peak_allocated``, ``peak_reserved``, ``samples``); ``_cache`` memoises
    tables the analyzers derive from the trace (kernel classes of names, the CPU tree).
    ``comms`` is the side table of communication events (rows in
    :data:`~torchprof_args.analysis.comm_events.COMM_FIELDS` order) when the trace was loaded
    with ``comms=True``, else None.
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
    comms: list[tuple[Any, ...]] | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def rank(self) -> int | None:
        """``distributedInfo.rank``, when the trace states it."""
        info = self.metadata.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) else None

    @property
    def world_size(self) -> int | None:
        """``distributedInfo.world_size``, when the trace states it."""
        info = self.metadata.get("distributedInfo")
        size = info.get("world_size") if isinstance(info, dict) else None
        return size if isinstance(size, int) else None

    @property
    def base_time_ns(self) -> int:
        """``baseTimeNanoseconds``: the clock the event times are relative to (0 when absent)."""
        base = self.metadata.get("baseTimeNanoseconds")
        return int(base) if isinstance(base, (int, float)) else 0


# -- decoding: event text -> columns ----------------------------------------------------------
class _Args(msgspec.Struct, gc=False, frozen=True):
    stream: int = -1
    correlation: int = -1


class _MemArgs(msgspec.Struct, gc=False, frozen=True):
    """The allocator's totals; -1 where a field is missing (the device: type 0, id -1 = CPU)."""

    total_allocated: int = msgspec.field(default=-1, name="Total Allocated")
    total_reserved: int = msgspec.field(default=-1, name="Total Reserved")
    device_type: int = msgspec.field(default=0, name="Device Type")
    device_id: int = msgspec.field(default=-1, name="Device Id")


_NO_ARGS = _Args()
_NO_MEM = _MemArgs()


class _X(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event: the only kind the analyses time."""

    name: str = ""
    cat: str = NO_CAT
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


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


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
            cat=event.cat if isinstance(event.cat, str) else (NO_CAT if event.cat is None else str(event.cat)),
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
                total_allocated=_minus1(_int(args.get("Total Allocated"))),
                total_reserved=_minus1(_int(args.get("Total Reserved"))),
                device_type=_or(_int(args.get("Device Type")), 0),
                device_id=_minus1(_int(args.get("Device Id"))),
            ),
        )
    return _SKIP


def decode_events(text: Any, comms: bool = False) -> list[Any]:
    """Typed fast path; a batch with unusual values is decoded loosely and normalised.

    ``comms`` decodes the communication fields too (:mod:`~torchprof_args.analysis.comm_events`).
    Raises ``msgspec.DecodeError`` only when ``text`` is not a JSON array (a wrong cut).
    """
    if comms:
        from torchprof_args.analysis.comm_events import decode_comm_events

        return decode_comm_events(text)
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


#: per device, what the ``[memory]`` samples say: peak allocator totals (bytes) and sample count.
MEMORY_COLUMNS = (("device", np.int32), ("peak_allocated", np.int64), ("peak_reserved", np.int64),
                  ("samples", np.int64))


@dataclass
class Part:
    """One batch reduced to columns; ``key`` indexes ``keys``, its (name, cat, pid, tid) tuples;
    ``memory`` sums up the batch's ``[memory]`` samples per device (:data:`MEMORY_COLUMNS`)."""

    n_events: int
    ts: np.ndarray
    dur: np.ndarray
    key: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    keys: list[tuple[Any, Any, Any, Any]]
    memory: dict[str, np.ndarray]
    #: Communication rows (``comms=True`` only).
    comms: list[tuple[Any, ...]] = field(default_factory=list)


PART_COLUMNS = (("ts", np.float64), ("dur", np.float64), ("key", np.int32), ("stream", np.int32), ("corr", np.int64))


def _int_column(args: list[Any], getter: Any, n: int) -> np.ndarray:
    try:
        return np.fromiter(map(getter, args), np.int64, n)
    except OverflowError:  # beyond int64: only the sign matters to the analyses
        return np.array([max(min(getter(a), 2**63 - 1), -(2**63)) for a in args], dtype=np.int64)


def reduce_batch(events: list[Any], comms: bool = False, memory_events: bool = True) -> Part:
    """Columns of one decoded batch, built without a Python-level loop over the events
    (``comms``: events from :func:`decode_events` with ``comms=True``, communication rows kept).

    ``memory_events=False`` says the batch's text holds no ``[memory]`` event (the caller looked),
    so the events are not scanned for them.
    """
    x_class: Any = _X
    if comms:
        from torchprof_args.analysis.comm_events import XComm, comm_rows

        x_class = XComm
    xs = [e for e in events if e.__class__ is x_class]
    memory = _memory_samples(events if memory_events and len(xs) != len(events) else [])
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
    rows = comm_rows(xs, args, key, keys) if comms else []
    del xs
    stream = _int_column(args, _get_stream, n)
    if n and (stream.max() > I32_MAX or stream.min() < I32_MIN):
        stream = np.clip(stream, -1, I32_MAX)  # absurd stream numbers: only >= 0 or -1 matters
    stream = stream.astype(np.int32)
    corr = _int_column(args, _get_corr, n)
    del args
    keep = ~(np.isnan(ts) | np.isnan(dur))
    if any(k[1] == NO_CAT for k in keys):
        keep &= ~np.array([k[1] == NO_CAT for k in keys], dtype=bool)[key]
    if not keep.all():
        ts, dur, key, stream, corr = ts[keep], dur[keep], key[keep], stream[keep], corr[keep]
    return Part(len(events), ts, dur, key, stream, corr, keys, memory, rows)


_get_mem_args = attrgetter("args")
_MEM_FIELDS = (("allocated", attrgetter("total_allocated")), ("reserved", attrgetter("total_reserved")),
               ("type", attrgetter("device_type")), ("id", attrgetter("device_id")))


def _memory_samples(events: list[Any]) -> dict[str, np.ndarray]:
    """Per device, the peaks and count of the ``[memory]`` instant events (no per-event Python
    statement: CPU traces recorded with ``profile_memory`` hold one for every allocation and
    free, so only their per-device peaks are kept, not the samples)."""
    found = [e for e in events if e.__class__ in _INSTANTS and e.name == "[memory]"]
    args = list(map(_get_mem_args, found))
    n = len(args)
    cols = {name: np.fromiter(map(get, args), np.int64, n) for name, get in _MEM_FIELDS}
    keep = (cols["allocated"] != -1) | (cols["reserved"] != -1)
    device = (cols["type"] * 65536 + (cols["id"] + 1))[keep]
    return reduce_memory(device, np.maximum(cols["allocated"][keep], 0), np.maximum(cols["reserved"][keep], 0),
                         np.ones(len(device), dtype=np.int64))


def reduce_memory(device: np.ndarray, allocated: np.ndarray, reserved: np.ndarray,
                  samples: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of :data:`MEMORY_COLUMNS`, one per distinct device code, from rows of any number."""
    codes, where = np.unique(device, return_inverse=True)
    peak_alloc = np.zeros(len(codes), dtype=np.int64)
    peak_res = np.zeros(len(codes), dtype=np.int64)
    np.maximum.at(peak_alloc, where, allocated)
    np.maximum.at(peak_res, where, reserved)
    return {"device": codes.astype(np.int32), "peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "samples": np.bincount(where, weights=samples, minlength=len(codes)).astype(np.int64)}
