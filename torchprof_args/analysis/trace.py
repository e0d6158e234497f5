"""The trace model: one rank's Kineto trace as compact per-event numpy columns.

:mod:`.decode.loader` builds a :class:`Trace` from a file (decoded by :mod:`.decode.events` and
:mod:`.decode.columns`, in worker processes by :mod:`.decode.parallel` when the file is large); the analyzers
(:mod:`.analyzers`) read it and keep what they derive from it in its :class:`TraceMemo`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

__all__ = ["MEMORY_ROW_COLUMNS", "CompiledArgs", "MemoryRows", "StepSpan", "Trace", "TraceMemo"]

#: the columns of :class:`MemoryRows`: time (us, as in the trace), block address, bytes (negative:
#: freed), the allocator's totals after the event (-1: not recorded), the device code
#: (``device_type * 65536 + device_id + 1``) and the thread (an index into ``threads``).
MEMORY_ROW_COLUMNS = (("ts", np.float64), ("addr", np.uint64), ("bytes", np.int64), ("allocated", np.int64),
                      ("reserved", np.int64), ("device", np.int32), ("thread", np.int32))


@dataclass
class MemoryRows:
    """``[memory]`` events in file order as :data:`MEMORY_ROW_COLUMNS`; ``threads[thread[i]]`` is
    event ``i``'s ``(pid, tid)``."""

    columns: dict[str, np.ndarray] = field(
        default_factory=lambda: {name: np.zeros(0, dtype) for name, dtype in MEMORY_ROW_COLUMNS})
    threads: list[tuple[Any, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.columns["ts"])

    @classmethod
    def concat(cls, parts: list[MemoryRows]) -> MemoryRows:
        """The rows of ``parts`` (in file order) in one table, their threads interned together."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls()
        threads: dict[tuple[Any, Any], int] = {}
        thread_cols = []
        for part in parts:
            table = np.array([threads.setdefault(t, len(threads)) for t in part.threads], dtype=np.int32)
            thread_cols.append(table[part.columns["thread"]])
        columns = {name: np.concatenate([p.columns[name] for p in parts]) for name, _ in MEMORY_ROW_COLUMNS
                   if name != "thread"}
        columns["thread"] = np.concatenate(thread_cols)
        return cls(columns, list(threads))


@dataclass
class CompiledArgs:
    """What compiled code's events carry in their ``args``, kept for the few events that have it:
    inductor's estimates on each Triton kernel launch (``kernel_flop``: FLOPs; ``kernel_num_gb``: GB
    read and written) and the autograd ``Sequence number`` of each ``CompiledFunction`` and
    ``CompiledFunctionBackward`` (which ties a backward to its forward).  -1 where absent."""

    idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    flop: np.ndarray = field(default_factory=lambda: np.zeros(0))
    gb: np.ndarray = field(default_factory=lambda: np.zeros(0))
    seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.idx)

    def take(self, rows: np.ndarray) -> CompiledArgs:
        """The rows ``rows`` (a mask or indices)."""
        return CompiledArgs(self.idx[rows], self.flop[rows], self.gb[rows], self.seq[rows])

    @classmethod
    def concat(cls, parts: list[tuple[int, CompiledArgs]]) -> CompiledArgs:
        """One table from ``(offset of the part's first event, its rows)`` pairs in file order."""
        parts = [(offset, p) for offset, p in parts if len(p)]
        if not parts:
            return cls()
        return cls(np.concatenate([p.idx + offset for offset, p in parts]),
                   np.concatenate([p.flop for _, p in parts]), np.concatenate([p.gb for _, p in parts]),
                   np.concatenate([p.seq for _, p in parts]))


class StepSpan(TypedDict):
    """One ``ProfilerStep#N`` annotation on the CPU: its name, start and duration (us, the trace's
    clock), as :func:`.analyzers.steps.steps` finds them."""

    name: str
    start_us: float
    dur_us: float


@dataclass
class TraceMemo:
    """Tables the analyzers derive from one :class:`Trace`, each computed on first use (None until
    then) and kept, because several analyses of a summary need the same ones.

    Valid for as long as the trace's columns are unchanged: nothing in the package writes to a
    loaded trace; code that does must call :meth:`clear`.
    """

    #: ``ProfilerStep#N`` spans (:func:`.analyzers.steps.steps`: a ``StepSpan`` each).
    steps: list[StepSpan] | None = None
    #: the CPU events' nesting: ``idx``, ``parent``, ``depth``, ``bounds``
    #: (:func:`.analyzers.cpu_ops.cpu_tree`).
    cpu_tree: dict[str, np.ndarray] | None = None
    #: per-name operator totals (:func:`.analyzers.cpu_ops.cpu_ops`).
    cpu_ops: dict[str, np.ndarray] | None = None
    #: kernel class of every name, as text and as a small integer (:mod:`.analyzers.gpu`).
    name_types: np.ndarray | None = None
    name_codes: np.ndarray | None = None
    #: the steps, kernels and GPU idle time the diagnose analyzers share
    #: (:func:`.analyzers.stepwise.context`).
    diagnose: Any = None
    #: the rank's collectives as its trace names its rank (:func:`.analyzers.collectives.rank_collectives`:
    #: ``diagnose`` and the critical path both need them; not to be changed by a reader).
    rank_comms: Any = None
    #: the generated kernels matched to the compiled-modules file beside the trace
    #: (:func:`.analyzers.compiled.kernel_modules.kernel_module_match`).
    kernel_modules: Any = None

    def clear(self) -> None:
        """Forget every table (after a change to the trace's columns)."""
        for f in fields(self):
            setattr(self, f.name, None)


@dataclass
class Trace:
    """One rank's trace as columns.  ``names[name_id[i]]`` is event ``i``'s name, etc.

    Times are microseconds as written in the file (relative to ``baseTimeNanoseconds`` when the
    trace has one).  Complete events missing ``dur`` or ``cat`` are dropped, like HTA does.
    ``stream`` and ``corr`` are -1 where the event has none.  ``memory`` sums up the ``[memory]``
    events per device (``device`` code, ``peak_allocated``, ``peak_reserved``, ``samples``).
    ``comms`` is the side table of communication events (rows in
    :data:`~torchprof_args.analysis.decode.comm_events.COMM_FIELDS` order) when the trace was loaded
    with ``comms=True``, else None.  ``name_cat[n]`` is the category id of name ``n``'s first
    event (None when the builder did not record it).  ``memo`` holds the analyzers' derived tables.
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
    name_cat: np.ndarray | None = field(default=None, repr=False)
    #: the events with a FLOP count (from their recorded shapes, :mod:`.decode.op_flops`, or ``args.flops``):
    #: their indices and counts; None when the builder did not look, empty arrays when none has one.
    flops: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    #: every ``[memory]`` event (:class:`MemoryRows`); None when the builder did not keep them
    #: (``load_trace(..., memory_rows=True)`` does).
    memory_rows: MemoryRows | None = field(default=None, repr=False)
    #: compiled code's ``args``: inductor's estimates on its Triton kernels' launches, the compiled
    #: functions' sequence numbers (empty: an eager job).
    compiled_args: CompiledArgs = field(default_factory=CompiledArgs, repr=False)
    memo: TraceMemo = field(default_factory=TraceMemo, repr=False, compare=False)

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
