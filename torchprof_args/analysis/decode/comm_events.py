"""The communication events of a trace, with the fields Kineto records on them.

Used by ``torchprof collectives``.
The trace model keeps two ``args`` of each event (stream, correlation): decoding more for every
event costs ~17 % of the reader's time, so only a loader asked for ``comms=True`` decodes with the
wider :class:`XComm` struct, and keeps a side table of the few events that are collectives:

* NCCL kernels (``ncclKernel_*`` / ``ncclDevKernel_*``) and their ``record_param_comms`` /
  ``nccl:<op>`` CPU records, which carry (depending on the PyTorch version) the collective name,
  the process group's name, description and ranks, the sequence number, message sizes and dtype;
* gloo's ``gloo:<op>`` annotations on its worker threads (CPU jobs), whose ``Input Dims`` /
  ``Input type`` (with ``record_shapes``) give the message size.

One row per such event, as a tuple in :data:`COMM_FIELDS` order (cheap to send between the
decoding processes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from torchprof_args.analysis.decode.events import (
    INSTANTS,
    NO_CAT,
    NO_RAW,
    SKIPPED,
    LooseEvent,
    XEvent,
    decode_batch,
    list_of_union,
    tighten,
)

__all__ = ["COMM_FIELDS", "XComm", "comm_row", "comm_rows", "decode_comm_events", "is_comm_name"]

COMM_FIELDS = (
    "ts", "dur", "name", "cat", "pid", "tid", "stream", "corr",
    "collective", "pg_name", "pg_desc", "pg_ranks", "group_size", "seq",
    "in_nelems", "out_nelems", "dtype", "input_dims", "input_type",
)


class _CommArgs(msgspec.Struct, gc=False, frozen=True):
    """``args`` of any event, with the communication fields (``Any`` where writers disagree on
    types)."""

    stream: int = -1
    correlation: int = -1
    flops: float = 0.0
    kernel_flop: float = -1.0
    kernel_num_gb: float = -1.0
    sequence: int = msgspec.field(default=-1, name="Sequence number")
    collective: Any = msgspec.field(default=None, name="Collective name")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_size: Any = msgspec.field(default=None, name="Group size")
    seq: Any = msgspec.field(default=None, name="Seq")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = msgspec.field(default=None, name="dtype")
    #: On every operator when shapes are recorded: kept as raw JSON text, parsed only for comms.
    input_dims: msgspec.Raw = msgspec.field(default=NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=NO_RAW, name="Input type")


_NO_COMM_ARGS = _CommArgs()


class XComm(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event decoded with the communication fields of its ``args``."""

    name: str = ""
    cat: str = NO_CAT
    ts: float = math.nan
    dur: float = math.nan
    pid: int | str = 0
    tid: int | str = 0
    args: _CommArgs = _NO_COMM_ARGS


_typed = msgspec.json.Decoder(list_of_union(XComm, *INSTANTS, *SKIPPED), strict=False)
_encode = msgspec.json.Encoder().encode


_ARG_KEYS = {
    "collective": "Collective name", "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description", "pg_ranks": "Process Group Ranks", "group_size": "Group size",
    "seq": "Seq", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems", "dtype": "dtype",
}


def _tighten_comm(event: LooseEvent) -> Any:
    """The loose path's event, with the communication fields when it is a complete event."""
    base = tighten(event)
    if base.__class__ is not XEvent:
        return base
    args = event.args if isinstance(event.args, dict) else {}
    raw = {key: msgspec.Raw(_encode(args[key])) for key in ("Input Dims", "Input type") if key in args}
    return XComm(name=base.name, cat=base.cat, ts=base.ts, dur=base.dur, pid=base.pid, tid=base.tid,
                 args=_CommArgs(stream=base.args.stream, correlation=base.args.correlation,
                                flops=base.args.flops, kernel_flop=base.args.kernel_flop,
                                kernel_num_gb=base.args.kernel_num_gb, sequence=base.args.sequence,
                                input_dims=raw.get("Input Dims", NO_RAW),
                                input_type=raw.get("Input type", NO_RAW),
                                **{name: args.get(key) for name, key in _ARG_KEYS.items()}))


def decode_comm_events(text: Any) -> list[Any]:
    """Like :func:`~torchprof_args.analysis.decode.events.decode_plain`, with :class:`XComm` complete
    events."""
    return decode_batch(text, _typed, _tighten_comm)


def is_comm_name(name: str) -> bool:
    """Whether an event of this name is communication: NCCL kernels and annotations (``nccl``,
    also RCCL's), gloo's ``gloo:<op>``, ``record_param_comms``, and the ``c10d::`` operators that issue
    collectives (what a gloo collective was asked as)."""
    head = name[:24].lower()
    return "nccl" in head or head.startswith(("gloo:", "xccl:", "record_param_comms", "c10d::"))


def _text(raw: msgspec.Raw) -> str | None:
    return bytes(raw).decode("utf-8", "replace") if raw else None  # NO_RAW: the field is missing


def comm_row(event: XComm) -> tuple[Any, ...] | None:
    """The event as a row in :data:`COMM_FIELDS` order; None for what the trace model drops too."""
    if math.isnan(event.ts) or math.isnan(event.dur) or event.cat == NO_CAT:
        return None
    a = event.args
    return (event.ts, event.dur, event.name, event.cat, event.pid, event.tid, a.stream, a.correlation,
            a.collective, a.pg_name, a.pg_desc, a.pg_ranks, a.group_size, a.seq,
            a.in_nelems, a.out_nelems, a.dtype, _text(a.input_dims), _text(a.input_type))


def comm_rows(key: np.ndarray, keys: list[tuple[Any, ...]], marked: np.ndarray,
              events_at: Callable[[list[int]], list[XComm]]) -> list[tuple[Any, ...]]:
    """Rows of the communication events of one batch: named like one, or carrying a collective
    name (``marked``: a bool per complete event).

    ``key[i]`` indexes ``keys`` (event i's interned (name, cat, pid, tid)): the name test runs
    once per distinct key, not per event; ``events_at(at)``: the complete events ``at``, decoded.
    """
    if not len(key):
        return []
    named = np.array([is_comm_name(k[0]) for k in keys] + [False], dtype=bool)[key]
    at = np.flatnonzero(named | marked).tolist()
    return [row for event in events_at(at) if (row := comm_row(event)) is not None]
