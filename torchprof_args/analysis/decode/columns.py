"""One batch of event text -> compact numpy columns (a :class:`ColumnBatch`).

For every complete event the trace model keeps its start, duration, interned (name, cat, pid, tid)
key, CUDA stream and correlation id (~36 bytes an event), and per device the peaks of the
``[memory]`` instant events.  Every column is filled by C-level iteration (``np.fromiter`` over
``attrgetter``); names, categories and threads are interned together through one dict keyed by
the ``(name, cat, pid, tid)`` tuple: a few hundred distinct keys cover millions of events.

:func:`decode_columns` is the one way from text to columns, here or in a worker process
(:mod:`.parallel`): the project's C extension ``_fastcolumns`` writes the columns straight from the
text, about twice as fast, in every mode but ``memory_rows`` (with ``comms`` or ``flops`` msgspec
decodes again only the events whose rows or shapes are needed, from their own text); any batch it
does not reproduce exactly, the memory rows' mode, and every batch where the extension is not built
or ``TORCHPROF_PURE_PYTHON=1`` is set go through msgspec (:func:`decode_events`,
:func:`reduce_batch`), the reference.  :mod:`.loader` assembles a file's parts into a
:class:`~.trace.Trace`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from operator import attrgetter
from typing import Any

import numpy as np

from torchprof_args.analysis.decode.comm_events import XComm, comm_rows, decode_comm_events
from torchprof_args.analysis.decode.events import INSTANTS, NO_CAT, XEvent, XShapeEvent, decode_plain
from torchprof_args.analysis.decode.memory_rows import memory_rows_of
from torchprof_args.analysis.decode.op_flops import FLOP_OPS, shape_flops
from torchprof_args.analysis.extensions import extension
from torchprof_args.analysis.trace import CompiledArgs, MemoryRows

__all__ = [
    "BATCH_COLUMNS", "MEMORY_COLUMNS", "ColumnBatch", "decode_columns", "decode_events",
    "fast_decoder", "reduce_batch", "reduce_memory",
]

I32_MAX = 2**31 - 1
I32_MIN = -(2**31)

#: per device, what the ``[memory]`` samples say: peak allocator totals (bytes) and sample count.
MEMORY_COLUMNS = (("device", np.int32), ("peak_allocated", np.int64), ("peak_reserved", np.int64),
                  ("samples", np.int64))


@dataclass
class ColumnBatch:
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
    #: the kept events with a FLOP count (``args.flops``, else from their shapes: :mod:`.op_flops`):
    #: their indices in this part and the counts (``flops=True``).
    flops: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0)))
    #: every ``[memory]`` event (``memory_rows=True`` only).
    memory_rows: MemoryRows = field(default_factory=MemoryRows)
    #: compiled code's args (inductor's estimates, compiled functions' sequence numbers; indices
    #: into this part).
    compiled_args: CompiledArgs = field(default_factory=CompiledArgs)


#: the array columns of a :class:`ColumnBatch`, in its field order, with their dtypes.
BATCH_COLUMNS = (("ts", np.float64), ("dur", np.float64), ("key", np.int32), ("stream", np.int32),
                ("corr", np.int64))


def fast_decoder() -> Any:
    """The C extension ``_fastcolumns``; None where it is not built (no compiler at install) or
    ``TORCHPROF_PURE_PYTHON=1`` (:mod:`~torchprof_args.analysis.extensions`)."""
    return extension("torchprof_args.analysis.decode._fastcolumns")


def decode_columns(text: Any, comms: bool = False, memory_events: bool = True, flops: bool = False,
                   memory_rows: bool = False) -> ColumnBatch:
    """One batch of event text (a JSON array) -> its columns: ``reduce_batch(decode_events(...))``,
    the same columns written by the C decoder where it can (not with ``memory_rows``; a batch it
    leaves, None, goes through msgspec).  The arguments are :func:`reduce_batch`'s.

    Raises ``msgspec.DecodeError`` only when ``text`` is not a JSON array (a wrong cut).
    """
    fast = None if memory_rows else fast_decoder()  # read per batch: the switch holds at any time
    if fast is not None:
        raw = fast.plain(text, memory_events, comms or flops)
        if raw is not None:
            return _fast_batch(text, comms, flops, *raw)
    return reduce_batch(decode_events(text, comms, flops), comms, memory_events, flops, memory_rows)


def _fast_batch(text: Any, comms: bool, flops: bool, n_events: int, ts: bytearray, dur: bytearray,
                key: bytearray, stream: bytearray, corr: bytearray, keys: list[tuple[Any, Any, Any, Any]],
                compiled_idx: bytearray, compiled_rows: bytearray, memory: bytearray, flop_counts: bytearray,
                marked: bytearray, spans: bytearray) -> ColumnBatch:
    """The :class:`ColumnBatch` of what ``_fastcolumns.plain`` returned (every complete event's
    columns, the compiled names' args, the ``[memory]`` events' totals; with ``comms`` or ``flops``
    the FLOP counts and where each event's text is), reduced as :func:`reduce_batch` reduces its
    own.  The few events whose rows or shapes it needs (communication, operators with FLOPs from their
    shapes) are decoded again from their own text by msgspec."""
    keyed = np.frombuffer(key, np.int32)
    rows = np.frombuffer(compiled_rows, np.float64).reshape(-1, 3)
    at = np.frombuffer(compiled_idx, np.int64)
    costs = _compiled_args(keyed, keys, lambda wanted: rows if np.array_equal(wanted, at) else _mismatch())
    mem = np.frombuffer(memory, np.int64).reshape(-1, 4)
    part = ColumnBatch(n_events, np.frombuffer(ts, np.float64), np.frombuffer(dur, np.float64), keyed,
                       _stream32(np.frombuffer(stream, np.int64)), np.frombuffer(corr, np.int64), keys,
                       _device_peaks(mem[:, 0], mem[:, 1], mem[:, 2], mem[:, 3]), compiled_args=costs)
    counts = None
    if comms or flops:
        where = np.frombuffer(spans, np.int64).reshape(-1, 2)

        def events_at(at: list[int]) -> list[Any]:  # the complete events ``at``, decoded from their text
            with memoryview(text) as view:
                return decode_events(b"[" + b",".join([view[s:e] for s, e in where[at].tolist()]) + b"]",
                                     comms, flops)

        if comms:
            part.comms = comm_rows(keyed, keys, np.frombuffer(marked, np.bool_), events_at)
        if flops:
            counts = _flop_counts(np.frombuffer(flop_counts, np.float64).copy(), keyed, keys, costs,
                                  lambda at: [e.args for e in events_at(at)])
    return _kept(part, counts)


def _mismatch() -> np.ndarray:
    raise AssertionError("_fastcolumns: the compiled names' events differ from the keys' (a bug)")


def decode_events(text: Any, comms: bool = False, shapes: bool = False) -> list[Any]:
    """Typed fast path; a batch with unusual values is decoded loosely and normalised.

    ``comms`` decodes the communication fields too (:mod:`~torchprof_args.analysis.decode.comm_events`),
    input shapes included; ``shapes`` the input shapes alone (for FLOPs).
    Raises ``msgspec.DecodeError`` only when ``text`` is not a JSON array (a wrong cut).
    """
    return decode_comm_events(text) if comms else decode_plain(text, shapes)


_get_ts = attrgetter("ts")
_get_dur = attrgetter("dur")
_get_key = attrgetter("name", "cat", "pid", "tid")
_get_args = attrgetter("args")
_get_stream = attrgetter("stream")
_get_corr = attrgetter("correlation")
_get_flops = attrgetter("flops")


def _int_column(args: list[Any], getter: Any, n: int) -> np.ndarray:
    try:
        return np.fromiter(map(getter, args), np.int64, n)
    except OverflowError:  # beyond int64: only the sign matters to the analyses
        return np.array([max(min(getter(a), 2**63 - 1), -(2**63)) for a in args], dtype=np.int64)


def _intern(xs: list[Any]) -> tuple[np.ndarray, list[tuple[Any, Any, Any, Any]]]:
    """Each event's index into the distinct (name, cat, pid, tid) keys, in order of first use."""
    n = len(xs)
    first: dict[tuple[Any, Any, Any, Any], int] = {}  # each new key with the index of its first event
    first_index = np.fromiter(map(first.setdefault, map(_get_key, xs), count()), np.intp, n)
    keys = list(first)
    lut = np.empty(n, dtype=np.int32)
    lut[np.fromiter(first.values(), np.intp, len(keys))] = np.arange(len(keys), dtype=np.int32)
    return lut[first_index], keys


def reduce_batch(events: list[Any], comms: bool = False, memory_events: bool = True,
                 flops: bool = False, memory_rows: bool = False) -> ColumnBatch:
    """Columns of one decoded batch, built without a Python-level loop over the events
    (``comms``: events from :func:`decode_events` with ``comms=True``, communication rows kept;
    ``flops``: the events' FLOP counts kept, sparse: most events have none; ``memory_rows``: every
    ``[memory]`` event kept, :mod:`.memory_rows`).

    ``memory_events=False`` says the batch's text holds no ``[memory]`` event (the caller looked),
    so the events are not scanned for them.
    """
    x_class: Any = XComm if comms else XShapeEvent if flops else XEvent
    xs = [e for e in events if e.__class__ is x_class]
    found = _memory_events(events if memory_events and len(xs) != len(events) else [])
    memory = _memory_samples(found)
    mem_rows = memory_rows_of(found) if memory_rows else MemoryRows()
    del found
    n = len(xs)
    ts = np.fromiter(map(_get_ts, xs), np.float64, n)
    dur = np.fromiter(map(_get_dur, xs), np.float64, n)
    key, keys = _intern(xs)
    args = list(map(_get_args, xs))
    if comms:
        rows = comm_rows(key, keys, np.fromiter((a.collective is not None for a in args), bool, n),
                         partial(_pick, xs))
    else:
        rows = []
    del xs
    stream = _stream32(_int_column(args, _get_stream, n))
    corr = _int_column(args, _get_corr, n)
    costs = _compiled_args(key, keys, partial(_arg_rows, args))
    counts = (_flop_counts(np.fromiter(map(_get_flops, args), np.float64, n), key, keys, costs,
                           partial(_pick, args)) if flops else None)
    del args
    part = ColumnBatch(len(events), ts, dur, key, stream, corr, keys, memory, rows, memory_rows=mem_rows,
                       compiled_args=costs)
    return _kept(part, counts)


def _stream32(stream: np.ndarray) -> np.ndarray:
    """Stream numbers (int64) as int32; a batch with absurd ones is clipped: only >= 0 or -1 matters."""
    if len(stream) and (stream.max() > I32_MAX or stream.min() < I32_MIN):
        stream = np.clip(stream, -1, I32_MAX)
    return stream.astype(np.int32)


def _kept(part: ColumnBatch, counts: np.ndarray | None) -> ColumnBatch:
    """``part`` without the events that have no start, duration or category (HTA drops them),
    with its events' FLOP ``counts`` where given (kept sparse)."""
    keep = ~(np.isnan(part.ts) | np.isnan(part.dur))
    if any(k[1] == NO_CAT for k in part.keys):
        keep &= ~np.array([k[1] == NO_CAT for k in part.keys], dtype=bool)[part.key]
    if not keep.all():
        part.ts, part.dur, part.key = part.ts[keep], part.dur[keep], part.key[keep]
        part.stream, part.corr = part.stream[keep], part.corr[keep]
        counts = counts[keep] if counts is not None else None
        costs = part.compiled_args
        kept = keep[costs.idx]
        costs = costs.take(kept)
        costs.idx = (np.cumsum(keep) - 1)[costs.idx]
        part.compiled_args = costs
    if counts is not None:
        where = np.flatnonzero(counts > 0)
        part.flops = (where.astype(np.int64), counts[where])
    return part


_get_compiled_args = attrgetter("kernel_flop", "kernel_num_gb", "sequence")
#: the compiled functions whose sequence number is kept (:class:`~.trace.CompiledArgs`).
_COMPILED_FUNCTIONS = ("CompiledFunction", "CompiledFunctionBackward")


def _pick(items: list[Any], at: list[int]) -> list[Any]:
    return [items[i] for i in at]


def _arg_rows(args: list[Any], at: np.ndarray) -> np.ndarray:
    """The (kernel_flop, kernel_num_gb, sequence) rows of the decoded events ``at`` (their ``args``)."""
    return np.array([_get_compiled_args(args[i]) for i in at.tolist()], dtype=np.float64).reshape(-1, 3)


def _compiled_args(key: np.ndarray, keys: list[tuple[Any, Any, Any, Any]],
                   rows_at: Callable[[np.ndarray], np.ndarray]) -> CompiledArgs:
    """Compiled code's args in the batch: inductor's ``kernel_flop`` / ``kernel_num_gb`` on events
    named ``triton*`` (inductor's kernel names), the sequence numbers of the compiled functions.  Only
    events with those names are looked at, so an eager trace costs nothing: ``rows_at(at)``, the
    (kernel_flop, kernel_num_gb, sequence) rows of events ``at``, as float64 (written to)."""
    launch = np.array([isinstance(k[0], str) and k[0].startswith("triton") for k in keys] + [False])
    function = np.array([k[0] in _COMPILED_FUNCTIONS for k in keys] + [False])
    if not launch.any() and not function.any():
        return CompiledArgs()
    at = np.flatnonzero((launch | function)[key])
    rows = rows_at(at)
    rows[~launch[key[at]], :2] = -1  # each name's own fields only
    rows[~function[key[at]], 2] = -1
    has = (rows >= 0).any(axis=1)
    return CompiledArgs(at[has].astype(np.int64), rows[has, 0], rows[has, 1], rows[has, 2].astype(np.int64))


def _flop_counts(counts: np.ndarray, key: np.ndarray, keys: list[tuple[Any, Any, Any, Any]],
                 costs: CompiledArgs, args_at: Callable[[list[int]], list[Any]]) -> np.ndarray:
    """Each event's ``args.flops`` (``counts``, written to), else inductor's ``kernel_flop``
    (:func:`_compiled_args`), else for the operators of :data:`FLOP_OPS` the FLOPs of its input shapes
    (torch.profiler writes no ``flops`` into the trace: :mod:`.op_flops`; ``args_at(at)``: the
    decoded ``args`` of events ``at``, with their shapes)."""
    if len(costs):  # (a compiled function's row has flop -1: it adds 0)
        counts[costs.idx] = np.where(counts[costs.idx] > 0, counts[costs.idx], np.maximum(costs.flop, 0))
    rules = [i for i, k in enumerate(keys) if k[0] in FLOP_OPS and k[1] == "cpu_op"]
    if rules:
        at = np.flatnonzero(np.isin(key, rules) & (counts == 0)).tolist()
        for i, args in zip(at, args_at(at), strict=True):
            counts[i] = shape_flops(keys[key[i]][0], args.input_dims)
    return counts


_get_mem_args = attrgetter("args")
_MEM_FIELDS = (("allocated", attrgetter("total_allocated")), ("reserved", attrgetter("total_reserved")),
               ("type", attrgetter("device_type")), ("id", attrgetter("device_id")))


def _memory_events(events: list[Any]) -> list[Any]:
    """The ``[memory]`` instant events of a batch."""
    return [e for e in events if e.__class__ in INSTANTS and e.name == "[memory]"]


def _memory_samples(found: list[Any]) -> dict[str, np.ndarray]:
    """Per device, the peaks and count of the ``[memory]`` instant events ``found`` (no per-event
    Python statement: CPU traces recorded with ``profile_memory`` hold one for every allocation and
    free, so only their per-device peaks are kept here; every event only with ``memory_rows``)."""
    args = list(map(_get_mem_args, found))
    n = len(args)
    cols = {name: np.fromiter(map(get, args), np.int64, n) for name, get in _MEM_FIELDS}
    return _device_peaks(cols["allocated"], cols["reserved"], cols["type"], cols["id"])


def _device_peaks(allocated: np.ndarray, reserved: np.ndarray, device_type: np.ndarray,
                  device_id: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`_memory_samples` of the ``[memory]`` events' totals and devices (int64 columns)."""
    keep = (allocated != -1) | (reserved != -1)
    device = (device_type * 65536 + (device_id + 1))[keep]
    return reduce_memory(device, np.maximum(allocated[keep], 0), np.maximum(reserved[keep], 0),
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
