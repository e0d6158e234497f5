"""Event text -> small structs: the first step of decoding a trace, shared by every decoder.

Speed comes from doing no per-event Python work: events are decoded by ``msgspec`` into small
structs (a union tagged by ``ph``, so flow and metadata events are skipped without building their
fields).  Only what the analyses need is decoded: for every complete (``ph: "X"``) event
(:class:`XEvent`) its name, category, times, process / thread and a few ``args`` (stream,
correlation, flops, inductor's kernel estimates), and the raw input shapes when FLOPs are asked for
(:class:`XShapeEvent`);
for the ``[memory]`` instant events the allocator's counters.  A batch the typed decoder rejects
(unusual value types) is decoded loosely and normalised (:func:`tighten`), slower but with the
same result.  :mod:`.comm_events` decodes wider complete events through the same
fallback (:func:`decode_batch`); :mod:`.columns` turns a batch of structs into columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Union

import msgspec

__all__ = [
    "INSTANTS", "NO_CAT", "NO_RAW", "SKIP", "SKIPPED", "LooseEvent", "XEvent", "XShapeEvent", "decode_batch",
    "decode_plain", "list_of_union", "tighten",
]

NO_CAT = "\x00"  # a missing category (HTA drops such events)
#: A missing raw field.  Not ``msgspec.Raw | None``: msgspec (up to 0.22 at least, its issue #659)
#: accepts only ``null`` for that type, so one operator with recorded shapes made the typed decoder
#: reject its whole batch, decoded then per event on the loose path, several times slower.
NO_RAW = msgspec.Raw()


class _Args(msgspec.Struct, gc=False, frozen=True):
    stream: int = -1
    correlation: int = -1
    #: the operator's FLOP count (``with_flops``; 0 when absent), kept only when asked (``flops=True``).
    flops: float = 0.0
    #: what inductor estimates for a Triton kernel it launches, written into the launch's ``args``
    #: (FLOPs and GB read + written; -1 when absent): :mod:`..analyzers.compiled.regions`.
    kernel_flop: float = -1.0
    kernel_num_gb: float = -1.0
    #: the autograd sequence number (ties a compiled function's backward to its forward; -1: none).
    sequence: int = msgspec.field(default=-1, name="Sequence number")


class _ShapeArgs(_Args, gc=False, frozen=True):
    """``args`` with the operator's input shapes kept as raw JSON (parsed only for the operators
    whose FLOPs they give: :mod:`.op_flops`)."""

    input_dims: msgspec.Raw = msgspec.field(default=NO_RAW, name="Input Dims")


class _MemArgs(msgspec.Struct, gc=False, frozen=True):
    """The allocator's totals; -1 where a field is missing (the device: type 0, id -1 = CPU); the
    block's address and its size (negative: a free), 0 where missing."""

    total_allocated: int = msgspec.field(default=-1, name="Total Allocated")
    total_reserved: int = msgspec.field(default=-1, name="Total Reserved")
    device_type: int = msgspec.field(default=0, name="Device Type")
    device_id: int = msgspec.field(default=-1, name="Device Id")
    addr: int = msgspec.field(default=0, name="Addr")
    bytes: int = msgspec.field(default=0, name="Bytes")


_NO_ARGS = _Args()
_NO_SHAPE_ARGS = _ShapeArgs()
_NO_MEM = _MemArgs()


class XEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event: the only kind the analyses time."""

    name: str = ""
    cat: str = NO_CAT
    ts: float = math.nan
    dur: float = math.nan
    pid: int | str = 0
    tid: int | str = 0
    args: _Args = _NO_ARGS


class XShapeEvent(XEvent, tag="X"):
    """A complete event with its input shapes (decoded only when FLOPs are asked for)."""

    args: _ShapeArgs = _NO_SHAPE_ARGS


class _Instant(msgspec.Struct, gc=False, tag_field="ph", tag="i"):
    name: str = ""
    ts: float = math.nan
    pid: int | str = 0
    tid: int | str = 0
    args: _MemArgs = _NO_MEM


class _InstantUpper(_Instant, tag="I"):
    pass


#: Every other Chrome-trace phase decodes to an empty struct: its fields are skipped, not built.
#: An unknown phase (or a missing ``ph``) makes the typed decoder reject the batch, which is then
#: decoded loosely (slower, same result).
SKIPPED = tuple(
    msgspec.defstruct(f"_Skip{ord(ph)}", [], tag_field="ph", tag=ph, gc=False)
    for ph in "BEbnestfPNODMVvRcC()"
)
#: The instant-event structs (``ph`` "i" or "I"); only ``[memory]`` ones are used.
INSTANTS = (_Instant, _InstantUpper)


class _Skipped:
    """What the loose path makes of events the analyses ignore."""


SKIP = _Skipped()


class LooseEvent(msgspec.Struct):
    """The same fields with any JSON type, for batches the typed decoder rejects."""

    ph: Any = ""
    name: Any = ""
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = 0
    tid: Any = 0
    args: Any = None




def list_of_union(*members: type) -> Any:
    """``list[A | B | ...]`` of structs known only at run time (:data:`SKIPPED`), for a decoder.

    Returns:
        The type; ``Any`` because a union built at run time is no type a checker can read.
    """
    union: Any = Union  # subscripted with a tuple variable: fine at run time, not in annotations
    return list[union[members]]


_typed = msgspec.json.Decoder(list_of_union(XEvent, *INSTANTS, *SKIPPED), strict=False)
_typed_shapes = msgspec.json.Decoder(list_of_union(XShapeEvent, *INSTANTS, *SKIPPED), strict=False)
_loose = msgspec.json.Decoder(list[LooseEvent], strict=False)
_loose_one = msgspec.json.Decoder(LooseEvent, strict=False)
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


def _or_minus1(value: float | None) -> float:
    return -1.0 if value is None else value


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


def _category(cat: Any) -> str:
    return cat if isinstance(cat, str) else (NO_CAT if cat is None else str(cat))


def tighten(event: LooseEvent) -> Any:
    """A loosely decoded event as the typed decoder would have made it (:data:`SKIP` if ignored)."""
    ph = event.ph
    args = event.args if isinstance(event.args, dict) else {}
    name = event.name if isinstance(event.name, str) else str(event.name)
    if ph == "X":
        return XEvent(
            name=name,
            cat=_category(event.cat),
            ts=_nan(_num(event.ts)),
            dur=_nan(_num(event.dur)),
            pid=event.pid if isinstance(event.pid, (int, str)) else str(event.pid),
            tid=event.tid if isinstance(event.tid, (int, str)) else str(event.tid),
            args=_Args(stream=_minus1(_int(args.get("stream"))),
                       correlation=_minus1(_int(args.get("correlation"))),
                       flops=_num(args.get("flops")) or 0.0,
                       kernel_flop=_or_minus1(_num(args.get("kernel_flop"))),
                       kernel_num_gb=_or_minus1(_num(args.get("kernel_num_gb"))),
                       sequence=_minus1(_int(args.get("Sequence number")))),
        )
    if ph in ("i", "I") and name == "[memory]":
        return _Instant(
            name=name,
            ts=_nan(_num(event.ts)),
            pid=event.pid if isinstance(event.pid, (int, str)) else str(event.pid),
            tid=event.tid if isinstance(event.tid, (int, str)) else str(event.tid),
            args=_MemArgs(
                total_allocated=_minus1(_int(args.get("Total Allocated"))),
                total_reserved=_minus1(_int(args.get("Total Reserved"))),
                device_type=_or(_int(args.get("Device Type")), 0),
                device_id=_minus1(_int(args.get("Device Id"))),
                addr=_or(_int(args.get("Addr")), 0),
                bytes=_or(_int(args.get("Bytes")), 0),
            ),
        )
    return SKIP


def decode_batch(text: Any, typed: msgspec.json.Decoder, loose: Callable[[LooseEvent], Any]) -> list[Any]:
    """``typed.decode(text)``; a batch it rejects is decoded loosely, each event through ``loose``.

    Raises ``msgspec.DecodeError`` only when ``text`` is not a JSON array (a wrong cut).
    """
    try:
        return typed.decode(text)
    except msgspec.ValidationError:
        pass
    try:
        return [loose(e) for e in _loose.decode(text)]
    except msgspec.ValidationError:  # an element that is not an object: count it, use nothing
        out = []
        for raw in _raw_list.decode(text):
            try:
                out.append(loose(_loose_one.decode(raw)))
            except msgspec.ValidationError:
                out.append(SKIP)
        return out


def decode_plain(text: Any, shapes: bool = False) -> list[Any]:
    """One batch of event text as :class:`XEvent` (``shapes``: :class:`XShapeEvent`), instant and
    skipped structs."""
    if shapes:
        return decode_batch(text, _typed_shapes, _tighten_shapes)
    return decode_batch(text, _typed, tighten)


_encode = msgspec.json.Encoder().encode


def _tighten_shapes(event: LooseEvent) -> Any:
    """:func:`tighten`, with the input shapes of a complete event."""
    base = tighten(event)
    if base.__class__ is not XEvent:
        return base
    args = event.args if isinstance(event.args, dict) else {}
    dims = msgspec.Raw(_encode(args["Input Dims"])) if "Input Dims" in args else NO_RAW
    return XShapeEvent(name=base.name, cat=base.cat, ts=base.ts, dur=base.dur, pid=base.pid, tid=base.tid,
                       args=_ShapeArgs(stream=base.args.stream, correlation=base.args.correlation,
                                       flops=base.args.flops, kernel_flop=base.args.kernel_flop,
                                       kernel_num_gb=base.args.kernel_num_gb, sequence=base.args.sequence,
                                       input_dims=dims))
