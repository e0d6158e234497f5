"""One trace's summary and one cycle's cross-rank view (layer 4 of :mod:`torchprof_args.analysis`,
beside :mod:`.diagnose`: composes the analyzers, imports nothing above them).

* :mod:`.document`: :class:`Summary`, the document (``torchprof summary --json``, a sidecar's
  ``summary``), its sections being the analyzers' own structs;
* :mod:`.compose`: :func:`summarize` (a loaded trace -> its summary) and :func:`truncate`;
* :mod:`.cross_rank`: :func:`cross_rank`, a cycle's summaries -> :class:`CrossRankView`.
"""

from __future__ import annotations

from torchprof_args.analysis.summary.compose import summarize, truncate
from torchprof_args.analysis.summary.cross_rank import CrossRankView, cross_rank
from torchprof_args.analysis.summary.document import StepTime, Summary, decode_summary

__all__ = ["CrossRankView", "StepTime", "Summary", "cross_rank", "decode_summary", "summarize", "truncate"]
