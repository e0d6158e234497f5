"""Cut a huge trace into standalone traces of at most N MB that Perfetto UI and TensorBoard open.

Two streaming passes.  The first records each event's size, start and kind; pieces are then
planned by ProfilerStep (consecutive small steps share a piece) and, where one step alone is too
big, by time window inside the step.  The second pass copies every event's original bytes into its
piece.  Each piece repeats the metadata (process/thread names, ``distributedInfo``,
``deviceProperties``, ``baseTimeNanoseconds``...).  An event that straddles a cut is kept whole
in the piece where it starts, so every complete event is in exactly one piece.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.steps import STEP_RE
from torchprof_args.analysis.decode.reader import EventText, TraceStream
from torchprof_args.analysis.jsonout import ArrayWriter
from torchprof_args.atomic import atomic_output
from torchprof_args.errors import TraceError
from torchprof_args.naming import strip_trace_suffixes


class _Light(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    ts: float = math.nan


_raw = msgspec.json.Decoder(list[msgspec.Raw])
_light = msgspec.json.Decoder(list[_Light], strict=False)
_any = msgspec.json.Decoder()


def _decode_both(text: EventText) -> tuple[list[msgspec.Raw], list[Any]]:
    """Each event's original bytes, and its ``ph`` / ``name`` / ``ts`` (loosely for odd values)."""
    raws = _raw.decode(text)
    try:
        light = _light.decode(text)
    except msgspec.ValidationError:
        light = []
        for e in _any.decode(text):
            e = e if isinstance(e, dict) else {}
            ts = _number(e.get("ts"))
            light.append(_Light(ph=str(e.get("ph", "")), name=str(e.get("name", "")), ts=ts))
    return raws, light


def _number(value: object) -> float:
    """An event's ``ts`` as a float, NaN when it is missing or not a number."""
    if not isinstance(value, (int, float, str)):
        return math.nan
    try:
        return float(value)
    except ValueError:
        return math.nan


def _header(metadata: dict[str, Any]) -> bytes:
    """A piece's opening: the trace's top-level fields, then ``"traceEvents": [``."""
    parts = [b'"' + k.encode() + b'": ' + msgspec.json.encode(v)
             for k, v in metadata.items() if k != "traceEvents"]
    return b"{" + b", ".join(parts + [b'"traceEvents": [\n'])


def plan_pieces(
    sizes: np.ndarray, ts: np.ndarray, step_starts: np.ndarray, budget: int
) -> np.ndarray:
    """Piece number for each (non-metadata) event: by step, then by time inside oversized steps."""
    n = len(sizes)
    piece = np.zeros(n, dtype=np.int32)
    if n == 0:
        return piece
    ts = np.where(np.isnan(ts), -np.inf, ts)
    window = np.maximum(np.searchsorted(np.sort(step_starts), ts, side="right") - 1, 0)
    order = np.lexsort((ts, window))
    w_sorted = window[order]
    bounds = np.flatnonzero(np.diff(w_sorted)) + 1
    groups = np.split(np.arange(n), bounds)
    inner = max(budget - int(sizes.max()), 1)
    current, used = 0, 0
    for group in groups:
        members = order[group]
        size = int(sizes[members].sum())
        if used > 0 and used + size > budget:
            current, used = current + 1, 0
        if used + size <= budget:
            piece[members] = current
            used += size
            continue
        cs = np.cumsum(sizes[members]) + used
        sub = (cs - 1) // inner
        piece[members] = current + sub
        current += int(sub[-1])
        used = int(cs[-1] - sub[-1] * inner)
    return piece


@dataclass
class _Scan:
    """What the first pass learns: per event its size, start and whether it is metadata."""

    metadata: dict[str, Any]
    sizes: np.ndarray
    ts: np.ndarray
    is_meta: np.ndarray
    step_starts: np.ndarray
    meta_events: list[bytes]


def _scan(path: Path, progress: bool) -> _Scan:
    """First pass over ``path``."""
    sizes: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    is_meta: list[np.ndarray] = []
    step_starts: list[float] = []
    meta_events: list[bytes] = []
    stream = TraceStream(path, progress=progress)
    for raws, light in stream.batches(_decode_both):
        sizes.append(np.fromiter((len(r) for r in raws), dtype=np.int64, count=len(raws)))
        ts = np.fromiter((e.ts for e in light), dtype=np.float64, count=len(light))
        meta = np.fromiter((e.ph == "M" for e in light), dtype=bool, count=len(light))
        stamps.append(ts)
        is_meta.append(meta)
        meta_events += [bytes(raws[i]) for i in np.flatnonzero(meta)]
        step_starts += [e.ts for e in light if e.ph == "X" and STEP_RE.match(e.name)]
    return _Scan(
        metadata=stream.metadata,
        sizes=np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64),
        ts=np.concatenate(stamps) if stamps else np.zeros(0),
        is_meta=np.concatenate(is_meta) if is_meta else np.zeros(0, dtype=bool),
        step_starts=np.array(step_starts),
        meta_events=meta_events,
    )


def split_trace(path: str | Path, max_mb: float, out_dir: str | Path | None = None,
                progress: bool = False) -> list[Path]:
    """Split a trace into standalone traces of at most ``max_mb`` MB each (uncompressed JSON), by step,
    then by time inside oversized steps; every piece keeps the trace's metadata and process names.

    Args:
        path: the trace.
        max_mb: the pieces' size limit.
        out_dir: where the pieces go (default ``<stem>.split`` beside the trace).
        progress: a progress bar while reading.

    Returns:
        The pieces, ``<out_dir>/<stem>.partNNN.json``, in order.

    Raises:
        TraceError: the trace cannot be read, or ``max_mb`` cannot hold the metadata plus the largest event.
    """
    path = Path(path)
    stem = strip_trace_suffixes(path.name, pt_trace=False)
    out = Path(out_dir) if out_dir is not None else path.parent / (stem + ".split")
    scan = _scan(path, progress)
    header = _header(scan.metadata)
    fixed = len(header) + sum(len(m) + 2 for m in scan.meta_events) + 16
    body = np.flatnonzero(~scan.is_meta)
    budget = int(max_mb * 1e6) - fixed - 2 * len(body) // max(len(body), 1)
    biggest = int((scan.sizes[body] + 2).max()) if len(body) else 0
    if budget <= biggest:
        raise TraceError(
            f"{path}: --max-mb {max_mb:g} is too small: metadata alone takes {fixed / 1e6:.2f} MB and the "
            f"largest event {biggest / 1e6:.3f} MB; use a larger --max-mb"
        )
    piece_of = np.full(len(scan.sizes), -1, dtype=np.int32)
    piece_of[body] = plan_pieces(scan.sizes[body] + 2, scan.ts[body], scan.step_starts, budget)
    n_pieces = int(piece_of.max()) + 1 if len(body) else 1
    out.mkdir(parents=True, exist_ok=True)
    finals = [out / f"{stem}.part{k:03d}.json" for k in range(n_pieces)]
    _write_pieces(path, finals, header, scan.meta_events, piece_of)
    return finals


def _write_pieces(path: Path, finals: list[Path], header: bytes, meta_events: list[bytes],
                  piece_of: np.ndarray) -> None:
    """Second pass: copy each event's original bytes into its piece (``-1``: metadata, already
    in every piece).  All pieces appear at once, or none on failure."""
    with contextlib.ExitStack() as stack:
        writers = []
        for final in finals:
            fh = stack.enter_context(atomic_output(final, "wb"))
            fh.write(header)
            writer = ArrayWriter(fh)
            writer.write_raw(meta_events)
            writers.append(writer)
        ordinal = 0
        for raws in TraceStream(path).batches(_raw.decode):
            pieces = piece_of[ordinal : ordinal + len(raws)]
            ordinal += len(raws)
            if len(raws) == 0:
                continue
            order = np.argsort(pieces, kind="stable")  # file order within each piece
            for group in np.split(order, np.flatnonzero(np.diff(pieces[order])) + 1):
                k = int(pieces[group[0]])
                if k >= 0:
                    writers[k].write_raw([raws[i] for i in group.tolist()])
        for writer in writers:
            writer.fh.write(b"\n]}\n")
