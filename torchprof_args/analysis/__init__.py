"""Fast tools for multi-GB Kineto traces of many ranks: load, summarise, compare, report, split,
merge, memory snapshots.

Layout, dependencies pointing one way: :mod:`.reader` streams a trace file in batches;
:mod:`.events`, :mod:`.comm_events` and :mod:`.columns` decode a batch into columns; :mod:`.trace`
is the column model, :mod:`.loader` (with :mod:`.parallel`'s worker processes) builds it; the
analyses are in :mod:`.analyzers`, one module each, and :mod:`.summary` composes them.  Many
traces: :mod:`.discover` finds them in run / cycle folders and groups them by cycle,
:mod:`.sidecar` keeps each one's summary beside it, :mod:`.collect` gathers summaries (sidecars,
else parsed by a pool of processes), :mod:`.cycles` per cycle, :mod:`.shard` splits the parsing
between the tasks of a cluster job.  :mod:`.text`, :mod:`.report` (with :mod:`.svg`) and
:mod:`.diff` render and compare summaries; :mod:`.split`, :mod:`.merge` and :mod:`.memsnap` are
the other tools, and :mod:`.commands` (with :mod:`.summary_command`, sharing :mod:`.cmdline`)
their ``torchprof`` sub-commands; :mod:`.collectives_command` (collectives across ranks) and
:mod:`.hang` / :mod:`.hang_command` (flight-recorder dumps through PyTorch's analyzer) have their
own.

Import-light: needs numpy and msgspec, never torch.
"""

from __future__ import annotations

from torchprof_args.analysis.analyzers.cross_rank import cross_rank
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.render.text import format_operator_table, format_profiler_list, format_summary
from torchprof_args.analysis.summary import summarize
from torchprof_args.analysis.trace import Trace
from torchprof_args.errors import TraceError

__all__ = [
    "Trace", "TraceError", "cross_rank", "format_operator_table", "format_profiler_list", "format_summary",
    "load_trace", "summarize",
]
