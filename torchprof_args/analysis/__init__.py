"""Fast tools for multi-GB Kineto traces of many ranks: load, summarise, diagnose, compare, report,
split, merge, memory snapshots.

Layers, each importing only the layers before it (``tests/test_layout.py`` fails on an import back
up, a cycle, a module of 400 lines or more):

1. the trace model: :mod:`.trace` (one rank's trace as numpy columns, :class:`Trace`),
   :mod:`.intervals` (the one interval type and its algebra) and :mod:`.jsonout` (strict JSON out);
   they import nothing of the package;
2. :mod:`.decode`: a trace file -> columns -> a :class:`Trace` (``load_trace``);
3. :mod:`.analyzers`: one analysis of a loaded trace per module; :mod:`.memory`: CUDA memory
   snapshots (not traces);
4. :mod:`.summary` (the analyzers composed into one trace's :class:`Summary`, and a cycle's
   cross-rank view) and :mod:`.diagnose` (what to fix: the kinds, their registry, a rank's part and
   the job's diagnosis);
5. :mod:`.collect`: which traces, and each one's results from its sidecar or parsed once, many at
   a time;
6. :mod:`.render`: text, HTML and SVG;
7. :mod:`.tools`: diff, split, merge, hang forensics; :mod:`.trend` (runs against a baseline) and
   :mod:`.dashboard` (the step timers' dashboard), from ``metrics.jsonl``.

The ``torchprof`` sub-commands over them are in :mod:`torchprof_args.commands`.  The offline side
of the package (the in-job side is :mod:`torchprof_args.capture`): importing this package imports
nothing; its public names load on first use.  Needs numpy and msgspec, never torch.
"""

from __future__ import annotations

from typing import Any

from torchprof_args.lazy import lazy_attribute

#: public name -> module that defines it (loaded lazily, like the package's own facade).
_LAZY = {
    "load_trace": "torchprof_args.analysis.decode.loader",
    "Trace": "torchprof_args.analysis.trace",
    "TraceError": "torchprof_args.errors",
    "Summary": "torchprof_args.analysis.summary",
    "CrossRankView": "torchprof_args.analysis.summary",
    "cross_rank": "torchprof_args.analysis.summary",
    "summarize": "torchprof_args.analysis.summary",
    "format_operator_table": "torchprof_args.analysis.render.text",
    "format_profiler_list": "torchprof_args.analysis.render.text",
    "format_summary": "torchprof_args.analysis.render.text",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    return lazy_attribute(globals(), _LAZY, __name__, name)
