"""What the job asks of the analysis, in one place: the summary of a trace it has just written.

The in-job side (``runtime/``, ``cli.py``, the frameworks) imports nothing else from ``analysis/``
(tests/test_layout.py checks it), so what the job depends on is this module's two functions and
the files they write, whose formats are the contract of ARCHITECTURE.md ("The two sides"):

* :func:`summarise_trace`: a trace's summary (and, for the publisher, its whole sidecar: summary,
  rank diagnosis, critical path, memory, within the trace's analysis budget), with the operator
  table rendered from it.  The publisher calls it on each staged trace; the ``@cli`` decorator on
  the published ones (their sidecars, else the traces).
* :func:`exporter_companion`: PyTorch's memory categorisation, which needs the profiler's results
  and so runs in the forked exporter before the trace is staged; it writes a companion file that
  :func:`summarise_trace` then takes as the sidecar's memory part.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from torchprof_args.analysis.collect.trace_results import MEMORY, SUMMARY, parse_results, results_of
from torchprof_args.analysis.memory.exported import exporter_companion, read_exported
from torchprof_args.analysis.render.text import format_operator_table
from torchprof_args.analysis.summary import Summary
from torchprof_args.errors import TraceError
from torchprof_args.time_limit import Deadline

__all__ = ["TraceSummary", "exporter_companion", "summarise_trace"]


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    """One trace's summary, and the sidecar's parts left out (name -> why) when a sidecar was written."""

    summary: Summary
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)

    def operator_table(self, rows: int = 30) -> str:
        """The operator table (``profiler_list.dat`` layout): top operators and memory, ``rows`` at most."""
        return format_operator_table(self.summary, rows=rows)


def summarise_trace(trace: str | os.PathLike[str], *, published: Path | None = None,
                    sidecar: Path | None = None, exporter_memory: str | None = None,
                    budget: Deadline | None = None) -> TraceSummary:
    """Summarise ``trace``; with ``sidecar``, compute and write its whole sidecar there first.

    Args:
        trace: the trace file (the publisher's staged, uncompressed copy, or a published trace).
        published: the trace the summary describes when ``trace`` is a copy of it (the sidecar
            names it); None: ``trace`` itself.
        sidecar: where to write the sidecar (every part, decoded once, in this process); None: the
            trace's matching sidecar is read instead, else the trace is parsed for its summary.
        exporter_memory: the companion file :func:`exporter_companion` wrote: the sidecar's memory
            part (else the trace's own categorisation, noting why).
        budget: when the parts beyond the summary must be done (``--torch-profile-analysis-budget``);
            what does not fit is left out of the sidecar and named in :attr:`TraceSummary.left_out`.

    Returns:
        The :class:`TraceSummary`.

    Raises:
        TraceError: the trace cannot be read.
        OSError: the sidecar cannot be written.
    """
    if sidecar is None and published is None:
        outcome = results_of(trace, (SUMMARY,))
    else:
        given = None
        if exporter_memory is not None:
            memory_file = exporter_memory
            given = {MEMORY.name: lambda loaded: read_exported(memory_file, loaded)}
        # One decoding process: decoding processes beside the training processes would only take more
        # of their cores, caches and memory bandwidth.
        outcome = parse_results(trace, (SUMMARY,), top=None, write=sidecar is not None, workers=1,
                                describes=published, target=sidecar, given=given, budget=budget)
    if outcome.results is None or outcome.results.summary is None:
        raise TraceError(str(outcome.error or f"{trace}: no summary"))
    if sidecar is not None and outcome.error:  # the sidecar could not be written
        raise OSError(str(outcome.error))
    return TraceSummary(outcome.results.summary, dict(outcome.left_out))
