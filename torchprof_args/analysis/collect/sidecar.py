"""Summary sidecars: a trace's results computed once, kept beside it, read instead of the trace.

``<trace folder>/summaries/<stem>.summary.json`` holds the trace's results, one key each (the
pipeline's parts, :mod:`.trace_results`: ``summary``, what ``torchprof summary --json --top all``
prints; ``diagnosis``, the rank's part of ``torchprof diagnose``), and the trace's
:class:`Fingerprint` (name, size and mtime).  The publisher writes one when it publishes a trace (it
parses the staged copy for the trace's operator table anyway); ``torchprof summary
--write-sidecars [--shard K/N]`` writes them for traces from elsewhere.  A sidecar is used only
while it matches its trace (same fingerprint, same sidecar version); otherwise the trace is parsed.
Sidecars live in a subfolder because HTA reads every ``.json`` / ``.gz`` file of a folder as a trace.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from torchprof_args.atomic import write_bytes_atomically
from torchprof_args.naming import sidecar_path
from torchprof_args.shared import formats

__all__ = ["Fingerprint", "sidecar_version", "stored_parts",
           "trace_fingerprint", "write_sidecar"]

#: the sidecar's own keys; every other key is one of the trace's results.
_HEADER_KEYS = ("format", "version", "trace", "left_out")


class Fingerprint(msgspec.Struct, frozen=True):
    """What a sidecar must agree on with its trace: the file's name, size and mtime (ns)."""

    name: str
    size: int
    mtime_ns: int


def trace_fingerprint(trace_path: Path) -> Fingerprint:
    """The trace file's :class:`Fingerprint` now.

    Raises:
        OSError: the file cannot be read.
    """
    st = os.stat(trace_path)
    return Fingerprint(trace_path.name, st.st_size, st.st_mtime_ns)


def write_sidecar(trace_path: str | os.PathLike[str], parts: Mapping[str, object],
                  fingerprint: Fingerprint | None = None, target: Path | None = None,
                  left_out: Mapping[str, str] | None = None) -> Path:
    """Publish the sidecar of ``trace_path`` (atomically).

    Args:
        trace_path: the trace the sidecar describes.
        parts: the trace's results by key (plain JSON values or msgspec structs; a result that could
            not be computed is None: readers then parse the trace).
        fingerprint: the trace's as it was when it was parsed (default: now); a trace replaced
            while it was parsed then gets a sidecar that does not match it.
        target: where (default ``naming.sidecar_path(trace_path)``, where readers look).
        left_out: the parts stored as null on purpose, each with why (``left_out`` in the sidecar:
            the analysis budget ran out; readers parse the trace for them).

    Returns:
        The sidecar's path.
    """
    trace_path = Path(trace_path)
    doc = {"format": formats.SIDECAR.name, "version": formats.SIDECAR.version,
           "trace": fingerprint or trace_fingerprint(trace_path), **parts}
    if left_out:
        doc["left_out"] = dict(left_out)
    target = target or sidecar_path(trace_path)
    write_bytes_atomically(target, _encode.encode(doc) + b"\n")
    return target


_encode = msgspec.json.Encoder(enc_hook=operator.methodcaller("item"))  # numpy scalars: Python numbers
_decode_raw = msgspec.json.Decoder(dict[str, msgspec.Raw])
_decode_fingerprint = msgspec.json.Decoder(Fingerprint)


class _Header(msgspec.Struct):
    format: str
    version: int


_decode_header = msgspec.json.Decoder(_Header)


def sidecar_version(trace_path: str | os.PathLike[str]) -> int | None:
    """The version of the sidecar beside ``trace_path`` (None: none, or not a sidecar): why a
    sidecar that does not match is not used, when it was written by another version."""
    try:
        header = _decode_header.decode(sidecar_path(Path(trace_path)).read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return header.version if header.format == formats.SIDECAR.name else None


def stored_parts(trace_path: str | os.PathLike[str]) -> dict[str, msgspec.Raw] | None:
    """The results kept for ``trace_path``, each still encoded, when its sidecar matches the trace.

    Args:
        trace_path: a trace file.

    Returns:
        Each result's JSON by key (decode only those needed); None without a sidecar, or when it
        does not match the trace (then parse the trace).
    """
    trace_path = Path(trace_path)
    try:
        data = sidecar_path(trace_path).read_bytes()
        fingerprint = trace_fingerprint(trace_path)
    except OSError:
        return None
    try:
        doc = _decode_raw.decode(data)
        matches = (msgspec.json.decode(doc["format"]) == formats.SIDECAR.name
                   and msgspec.json.decode(doc["version"]) == formats.SIDECAR.version
                   and _decode_fingerprint.decode(doc["trace"]) == fingerprint)
    except (KeyError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return {k: v for k, v in doc.items() if k not in _HEADER_KEYS} if matches else None
