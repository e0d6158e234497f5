"""Summary sidecars: a trace's summary computed once, kept beside it, read instead of the trace.

``<trace folder>/summaries/<stem>.summary.json`` holds what ``torchprof summary --json --top all``
prints for the trace (every kernel and operator, not only the top 30), the rank's part of
``torchprof diagnose`` (``diagnosis``: :func:`~.diagnose.rank_diagnosis`, read on its own by
:func:`read_diagnosis`) plus the trace's name, size and mtime.  The publisher writes one when it
publishes a trace (it parses the staged copy for the trace's operator table anyway); ``torchprof
summary --write-sidecars [--shard K/N]`` writes them for traces from elsewhere.  A sidecar is used
only while it matches its trace (same name, size and mtime, same sidecar version); otherwise the
trace is parsed.  Sidecars live in a subfolder
because HTA reads every ``.json`` / ``.gz`` file of a folder as a trace.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec

from torchprof_args.atomic import write_bytes_atomically
from torchprof_args.naming import sidecar_path

__all__ = [
    "SIDECAR_FORMAT", "SIDECAR_VERSION", "read_diagnosis", "read_sidecar", "sidecar_matches",
    "trace_identity", "truncate", "write_sidecar",
]

SIDECAR_FORMAT = "torchprof-summary"
#: bumped whenever the summary's content or its numbers change: older sidecars are then ignored.
SIDECAR_VERSION = 2
#: the summary's lists that ``--top`` bounds.
_TOP_LISTS = ("top_kernels", "top_cpu_ops", "top_cpu_ops_by_self", "top_ops_by_device")
_decode = msgspec.json.Decoder()


def trace_identity(trace_path: Path) -> dict[str, Any]:
    """What a sidecar must agree on with its trace: file name, size and mtime (ns)."""
    st = os.stat(trace_path)
    return {"name": trace_path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_sidecar(summary: dict[str, Any], trace_path: str | os.PathLike[str],
                  identity: dict[str, Any] | None = None, target: Path | None = None,
                  diagnosis: dict[str, Any] | None = None) -> Path:
    """Publish the sidecar of ``trace_path`` (atomically) from its complete summary (``top=None``).

    ``identity`` is the trace's :func:`trace_identity` as it was when it was parsed (default: now);
    a trace replaced while it was parsed then gets a sidecar that does not match it.  ``target``:
    where (default ``naming.sidecar_path(trace_path)``, where readers look).  ``diagnosis``: the
    rank's :func:`~.diagnose.rank_diagnosis` (None: ``diagnose`` will parse the trace).
    """
    trace_path = Path(trace_path)
    doc = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION,
           "trace": identity or trace_identity(trace_path), "summary": summary, "diagnosis": diagnosis}
    target = target or sidecar_path(trace_path)
    write_bytes_atomically(target, msgspec.json.encode(doc) + b"\n")
    return target


class _Header(msgspec.Struct):
    """A sidecar's fields but the summary (decoded without building the summary's objects)."""

    format: str = ""
    version: int = 0
    trace: dict[str, Any] = {}
    summary: msgspec.Raw = msgspec.Raw(b"null")
    diagnosis: msgspec.Raw = msgspec.Raw(b"null")


_decode_header = msgspec.json.Decoder(_Header)


def _matching(trace_path: Path) -> _Header | None:
    """The sidecar of ``trace_path`` when it matches the trace (its summary not decoded yet)."""
    try:
        data = sidecar_path(trace_path).read_bytes()
        identity = trace_identity(trace_path)
    except OSError:
        return None
    try:
        head = _decode_header.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if head.format != SIDECAR_FORMAT or head.version != SIDECAR_VERSION or head.trace != identity:
        return None
    return head


def sidecar_matches(trace_path: str | os.PathLike[str]) -> bool:
    """Whether ``trace_path`` has a sidecar that matches it (its summary is not decoded)."""
    return _matching(Path(trace_path)) is not None


def read_sidecar(trace_path: str | os.PathLike[str], top: int | None = 30) -> dict[str, Any] | None:
    """The summary kept for ``trace_path``, its lists cut to ``top``; None when there is no
    sidecar or it does not match the trace (then parse the trace)."""
    trace_path = Path(trace_path)
    head = _matching(trace_path)
    if head is None:
        return None
    try:
        summary = _decode.decode(head.summary)
    except msgspec.DecodeError:
        return None
    if not isinstance(summary, dict):
        return None
    summary["file"] = str(trace_path)
    return truncate(summary, top)


def read_diagnosis(trace_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The rank's diagnosis kept for ``trace_path`` (the summary is not decoded); None when there is
    no matching sidecar or it holds none (then parse the trace)."""
    trace_path = Path(trace_path)
    head = _matching(trace_path)
    if head is None:
        return None
    try:
        doc = _decode.decode(head.diagnosis)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    doc["file"] = str(trace_path)
    return doc


def truncate(summary: dict[str, Any], top: int | None) -> dict[str, Any]:
    """``summary`` (complete lists) with every top-N list cut to ``top`` entries (in place)."""
    if top is None:
        return summary
    top = max(top, 0)
    for key in _TOP_LISTS:
        if isinstance(summary.get(key), list):
            summary[key] = summary[key][:top]
    steps = summary.get("ops_in_steps")
    if isinstance(steps, dict):
        for key in ("cpu", "gpu"):
            if isinstance(steps.get(key), list):
                steps[key] = steps[key][:top]
    return summary
