"""Cut a huge trace into standalone traces of at most N MB that Perfetto UI and TensorBoard open.

Two streaming passes.  The first records each event's size, start and kind; pieces are then
planned by ProfilerStep (consecutive small steps share a piece) and, where one step alone is too
big, by time window inside the step.  The second pass copies every event's original bytes into its
piece.  Each piece repeats the metadata (process/thread names, ``distributedInfo``,
``deviceProperties``, ``baseTimeNanoseconds``...).  An event that straddles a cut is kept whole
in the piece where it starts, so every complete event is in exactly one piece.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchprof_args.analysis.reader import TraceStream
from torchprof_args.atomic import partial_path
from torchprof_args.errors import TraceError

_STEP = re.compile(r"^ProfilerStep#\d+$")


class _Light(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    ts: float = math.nan


_raw = msgspec.json.Decoder(list[msgspec.Raw])
_light = msgspec.json.Decoder(list[_Light], strict=False)
_any = msgspec.json.Decoder()


def _decode_both(text: bytes) -> tuple[list[msgspec.Raw], list[Any]]:
    raws = _raw.decode(text)
    try:
        light = _light.decode(text)
    except msgspec.ValidationError:
        light = []
        for e in _any.decode(text):
            e = e if isinstance(e, dict) else {}
            try:
                ts = float(e.get("ts"))
            except (TypeError, ValueError):
                ts = math.nan
            light.append(_Light(ph=str(e.get("ph", "")), name=str(e.get("name", "")), ts=ts))
    return raws, light


def strip_suffixes(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _header(metadata: dict[str, Any]) -> bytes:
    parts = [b'"' + k.encode() + b'": ' + msgspec.json.encode(v) for k, v in metadata.items() if k != "traceEvents"]
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


def split_trace(path: str | Path, max_mb: float, out_dir: str | Path | None = None, progress: bool = False) -> list[Path]:
    """Split ``path`` into pieces of at most ``max_mb`` MB (uncompressed JSON); returns their paths."""
    path = Path(path)
    out = Path(out_dir) if out_dir is not None else path.parent / (strip_suffixes(path) + ".split")
    budget_total = int(max_mb * 1e6)
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
        step_starts += [e.ts for e in light if e.ph == "X" and _STEP.match(e.name)]
    metadata = stream.metadata
    size = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
    ts = np.concatenate(stamps) if stamps else np.zeros(0)
    meta_mask = np.concatenate(is_meta) if is_meta else np.zeros(0, dtype=bool)
    header = _header(metadata)
    fixed = len(header) + sum(len(m) + 2 for m in meta_events) + 16
    body = np.flatnonzero(~meta_mask)
    budget = budget_total - fixed - 2 * len(body) // max(len(body), 1)
    biggest = int((size[body] + 2).max()) if len(body) else 0
    if budget <= biggest:
        raise TraceError(
            f"{path}: --max-mb {max_mb:g} is too small: metadata alone takes {fixed / 1e6:.2f} MB and the "
            f"largest event {biggest / 1e6:.3f} MB; use a larger --max-mb"
        )
    piece_of = np.full(len(size), -1, dtype=np.int32)
    piece_of[body] = plan_pieces(size[body] + 2, ts[body], np.array(step_starts), budget)
    n_pieces = int(piece_of.max()) + 1 if len(body) else 1

    out.mkdir(parents=True, exist_ok=True)
    stem = strip_suffixes(path)
    finals = [out / f"{stem}.part{k:03d}.json" for k in range(n_pieces)]
    temps = [partial_path(f) for f in finals]
    handles = [open(t, "wb", buffering=1 << 20) for t in temps]  # noqa: SIM115
    first = [True] * n_pieces
    try:
        for fh in handles:
            fh.write(header)
            for k, m in enumerate(meta_events):
                fh.write(m if k == 0 else b",\n" + m)
            if meta_events:
                first[handles.index(fh)] = False
        ordinal = 0
        for raws in TraceStream(path).batches(_raw.decode):
            pieces = piece_of[ordinal : ordinal + len(raws)]
            ordinal += len(raws)
            for raw, k in zip(raws, pieces.tolist(), strict=False):
                if k < 0:
                    continue
                fh = handles[k]
                if first[k]:
                    first[k] = False
                    fh.write(raw)
                else:
                    fh.write(b",\n")
                    fh.write(raw)
        for fh in handles:
            fh.write(b"\n]}\n")
    except BaseException:
        for fh, tmp in zip(handles, temps, strict=False):
            fh.close()
            tmp.unlink(missing_ok=True)
        raise
    for fh in handles:
        fh.close()
    for tmp, final in zip(temps, finals, strict=False):
        os.replace(tmp, final)
    return finals
