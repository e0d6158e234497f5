"""Fast tools for multi-GB Kineto traces: load, summarise, split, merge, report, memory snapshots.

Import-light: needs numpy and msgspec, never torch.
"""

from __future__ import annotations

from torchprof_args.analysis.loader import load_trace
from torchprof_args.analysis.summary import cross_rank, summarize
from torchprof_args.analysis.text import format_profiler_list, format_summary
from torchprof_args.analysis.trace import Trace
from torchprof_args.errors import TraceError

__all__ = ["Trace", "TraceError", "cross_rank", "format_profiler_list", "format_summary", "load_trace", "summarize"]
