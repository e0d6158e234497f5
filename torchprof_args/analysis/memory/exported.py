"""PyTorch's memory categorisation, from the exporter to the sidecar: a staged companion file.

The forked exporter still holds the profiler's results after it has written the trace; there
:func:`write_exported` runs :func:`~.pytorch_profile.memory_part` (bounded in time and by the
trace's size) and writes the result, or the one-line reason it could not, to a file in the rank's
staging directory beside the staged trace.  The publisher parses the trace anyway; it keeps
:func:`read_exported`'s part (with the trace's rank and coordinates) as the sidecar's ``memory``,
and falls back to categorising from the trace (:mod:`.trace_memory`) with the reason in its notes.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from torchprof_args.analysis.memory.categories import MemoryPart
from torchprof_args.analysis.memory.trace_memory import trace_identity, trace_memory_part
from torchprof_args.analysis.trace import Trace
from torchprof_args.atomic import atomic_output
from torchprof_args.shared import formats
from torchprof_args.time_limit import TimeLimitExceeded, time_limit

__all__ = ["EXPORT_SECONDS", "MAX_TRACE_BYTES", "Exported", "exporter_companion", "read_exported",
           "write_exported"]

#: the longest PyTorch's categorisation may run in the exporter, on the clock, whatever its CPU budget
#: (then the trace's is used): a backstop for a categorisation that waits.
EXPORT_SECONDS = 120
#: above this raw trace size it is not run (it builds the whole operator graph in memory, in a
#: process that shares the trainer's host memory).
MAX_TRACE_BYTES = 512 << 20


class Exported(msgspec.Struct, frozen=True):
    """The companion file: the part, or why there is none."""

    part: MemoryPart | None = None
    error: str | None = None


def write_exported(result: Any, path: str | os.PathLike[str], trace_bytes: int,
                   seconds: float | None = None) -> None:
    """Write PyTorch's categorisation of ``result`` (``profile.profiler.kineto_results``) to
    ``path``; never raises: a failure (over time, over size, an error in PyTorch's analysis) is
    written as the file's ``error``.  ``seconds``: its CPU limit (the exporter's part of the trace's
    analysis budget, ``--torch-profile-analysis-budget``; None: none); on the clock it may take
    :data:`EXPORT_SECONDS` at most."""
    if trace_bytes > MAX_TRACE_BYTES:
        found = Exported(error=f"the trace is {trace_bytes / 2**20:.0f} MiB (over {MAX_TRACE_BYTES >> 20} "
                               "MiB): PyTorch's memory categorisation was not run in the exporter")
    else:
        try:
            from torchprof_args.analysis.memory.pytorch_profile import memory_part

            started, cpu = time.monotonic(), time.process_time()
            with time_limit(seconds, wall=EXPORT_SECONDS):
                found = Exported(part=memory_part(result))
        except TimeLimitExceeded:
            found = Exported(error=f"PyTorch's memory categorisation was stopped in the exporter after "
                                   f"{time.process_time() - cpu:.1f} s of CPU, "
                                   f"{time.monotonic() - started:.1f} s in all (its part of the analysis "
                                   f"budget, --torch-profile-analysis-budget; at most {EXPORT_SECONDS:g} s)")
        except Exception as err:  # noqa: BLE001 - PyTorch's private analysis may fail on any trace
            found = Exported(error=f"PyTorch's memory categorisation failed in the exporter "
                                   f"({type(err).__name__}: {_gist(err)})")
    with contextlib.suppress(OSError), atomic_output(path, "wb") as handle:
        handle.write(msgspec.json.encode(found))


#: the longest part of an internal error's message kept in the one line that reports it
_GIST_CHARS = 100
#: where a dump of internals starts in a message: a dict or list, or a tuple after a colon
_DUMP = re.compile(r"\s*:?\s*[{\[]|:\s*\(")


def _gist(err: BaseException) -> str:
    """The head of ``err``'s message: its first line, before any dump of internals (PyTorch's memory
    profiler asserts with its tensor-version tables: ``version mismatch: {id=125: ...}``,
    ``duplicate outputs: MmBackward0 {id=94: ...}``)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
    text = _DUMP.split(text, maxsplit=1)[0] or "no message"
    return text if len(text) <= _GIST_CHARS else text[: _GIST_CHARS - 3] + "..."


def exporter_companion(profiler: Any) -> Callable[[str, int, float | None], None]:
    """What the exporter runs after the trace of ``profiler`` (a stopped ``torch.profiler.profile``):
    ``companion(path, trace_bytes, seconds)`` writes its memory categorisation to ``path`` within
    ``seconds`` (None: :data:`EXPORT_SECONDS`)."""
    def companion(path: str, trace_bytes: int, seconds: float | None = None) -> None:
        results = getattr(getattr(profiler, "profiler", None), "kineto_results", None)
        if results is None:
            with contextlib.suppress(OSError), atomic_output(path, "wb") as handle:
                handle.write(msgspec.json.encode(Exported(error="the profiler kept no results")))
            return
        write_exported(results, path, trace_bytes, seconds)

    return companion


_decode = msgspec.json.Decoder(Exported)


def read_exported(path: str | os.PathLike[str], trace: Trace) -> MemoryPart:
    """The sidecar's memory part of ``trace``: the exporter's (at ``path``) with the trace's rank and
    coordinates, else the trace's own categorisation noting why."""
    try:
        found = _decode.decode(Path(path).read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
        found = Exported(error=f"the exporter's memory categorisation could not be read ({err})")
    if found.part is not None and found.part.format == formats.MEMORY.version:
        return msgspec.structs.replace(found.part, **trace_identity(trace))
    fallback = trace_memory_part(trace)
    return msgspec.structs.replace(fallback, notes=[found.error or "no categorisation", *fallback.notes])
