"""The ``[memory]`` instant events one by one, as columns: what the memory breakdown reads.

``torch.profiler(profile_memory=True)`` records one ``[memory]`` event per allocation and free
(``Bytes`` negative for a free) with the block's address and the allocator's running totals.  The
summary needs only their peaks (:func:`~.columns.reduce_batch`); the memory breakdown
(:mod:`torchprof_args.analysis.memory.trace_memory`) needs every one, so they are kept only when
``load_trace(..., memory_rows=True)`` asks: 7 numbers (52 bytes) an event.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import numpy as np

from torchprof_args.analysis.trace import MEMORY_ROW_COLUMNS, MemoryRows

__all__ = ["memory_rows_of"]

_get_args = attrgetter("args")
_get_ts = attrgetter("ts")
_get_thread = attrgetter("pid", "tid")
_FIELDS = (("addr", attrgetter("addr")), ("bytes", attrgetter("bytes")),
           ("allocated", attrgetter("total_allocated")), ("reserved", attrgetter("total_reserved")))


def memory_rows_of(found: list[Any]) -> MemoryRows:
    """The rows of ``found``, a batch's ``[memory]`` instant events (decoded structs)."""
    n = len(found)
    if not n:
        return MemoryRows()
    args = list(map(_get_args, found))
    columns = {"ts": np.fromiter(map(_get_ts, found), np.float64, n)}
    for name, get in _FIELDS:
        columns[name] = _column(list(map(get, args)), dict(MEMORY_ROW_COLUMNS)[name])
    kind = np.fromiter((a.device_type for a in args), np.int64, n)
    index = np.fromiter((a.device_id for a in args), np.int64, n)
    columns["device"] = (kind * 65536 + index + 1).astype(np.int32)
    threads: dict[tuple[Any, Any], int] = {}
    columns["thread"] = np.fromiter((threads.setdefault(t, len(threads)) for t in map(_get_thread, found)),
                                    np.int32, n)
    return MemoryRows(columns, list(threads))


def _column(values: list[int], dtype: Any) -> np.ndarray:
    """``values`` as a ``dtype`` column; out-of-range values (a corrupt trace) are clipped."""
    try:
        return np.fromiter(values, dtype, len(values))
    except (OverflowError, ValueError):
        info = np.iinfo(dtype)
        return np.array([min(max(v, int(info.min)), int(info.max)) for v in values], dtype=dtype)
