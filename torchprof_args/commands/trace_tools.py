"""``torchprof summary | report | diff | split | merge``: the trace toolkit's command line.

Every trace command takes trace files, cycle folders or run folders
(:mod:`torchprof_args.analysis.collect.discover`), reads a trace's summary from its sidecar when
one matches and parses it otherwise (:mod:`torchprof_args.analysis.collect`, per cycle:
:mod:`.cycles`).  ``summary`` is in :mod:`.summary`; what the commands share in :mod:`.common`;
their errors are raised as :class:`~torchprof_args.errors.CommandError`, printed by the console.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from torchprof_args.capture.flags.types import positive_float, positive_int
from torchprof_args.commands import summary as summary_command
from torchprof_args.commands.common import INPUTS_HELP, Subparsers, add_clock_option, top_count
from torchprof_args.errors import CommandError, ExitStatus

if TYPE_CHECKING:
    from torchprof_args.analysis.critical_path.compare import PathChange
    from torchprof_args.analysis.critical_path.path import CriticalPathDoc
    from torchprof_args.analysis.diagnose.changes import FindingChange
    from torchprof_args.analysis.diagnose.documents import JobDiagnosis
    from torchprof_args.analysis.tools.diff import SummaryDiff


def _report_document(args: argparse.Namespace) -> tuple[Any, int]:
    """Write the report; what was written (``output``, ``bytes``, ``traces``, ``cycles``) and the exit
    status: what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.jsonout import finite
    from torchprof_args.analysis.render.report import write_report
    from torchprof_args.analysis.summary import cross_rank
    from torchprof_args.commands.cycles import cycle_summaries

    cycles, got = cycle_summaries(args.traces, args, args.top)
    found = [_diagnosis(c.files, args, c.label, with_memory=True) for c, _ in cycles]
    out = write_report([(c.label, s, cross_rank(s, k=args.slowest)) for c, s in cycles], args.output,
                       findings=[job for job, _, _ in found], paths=[finite(p) for _, p, _ in found],
                       memory=[memory for _, _, memory in found])
    doc = {"output": str(out), "bytes": out.stat().st_size, "traces": sum(len(s) for _, s in cycles),
           "cycles": len(cycles)}
    return doc, ExitStatus.PARTLY_FAILED if got.errors else ExitStatus.OK


def _report(args: argparse.Namespace) -> int:
    doc, status = _report_document(args)
    print(f"wrote {doc['output']} ({doc['bytes'] / 1e6:.2f} MB, {doc['traces']} trace(s), "
          f"{doc['cycles']} cycle(s))")
    return status


def _diagnosis(files: list[Any], args: argparse.Namespace, label: str | None, with_memory: bool = False
               ) -> tuple[JobDiagnosis | None, CriticalPathDoc | None, dict[str, Any] | None]:
    """``torchprof diagnose``'s and ``critical-path``'s results for one cycle's files (sidecars, else
    parsed; None when none of them can be read) and, ``with_memory``, ``torchprof mem``'s (from the
    sidecars; None without [memory] events)."""
    import msgspec

    from torchprof_args.analysis.collect.pool import collect
    from torchprof_args.analysis.collect.trace_results import CRITICAL_PATH, DIAGNOSIS, MEMORY
    from torchprof_args.analysis.critical_path.job_paths import critical_path
    from torchprof_args.analysis.diagnose.job_findings import diagnose
    from torchprof_args.analysis.diagnose.step_timers import formula_beside
    from torchprof_args.analysis.jsonout import finite
    from torchprof_args.analysis.memory.report import memory_report

    got = collect(files, parts=(DIAGNOSIS, CRITICAL_PATH, MEMORY.if_stored()), reparse=args.reparse,
                  workers=getattr(args, "workers", None))
    memory = got.memory  # from the sidecars: `torchprof mem` parses traces without
    report = memory_report(label or "", label, memory) if with_memory and memory else None
    memory_doc = None if report is None or report.peak is None else finite(msgspec.to_builtins(report))
    done = [r for r in got.results if r is not None and r.diagnosis is not None]
    if not done:
        return None, None, memory_doc
    graphs = [r.critical_path for r in done if r.critical_path is not None]
    whole = len(graphs) == len(done)
    job = diagnose([r.diagnosis for r in done if r.diagnosis is not None], label or "", label,
                   paths=graphs if whole else None, memory=[m for _, m in memory],
                   formula=formula_beside([r.path for r in done], args.roots))
    return job, critical_path(graphs, label or "", label) if whole and graphs else None, memory_doc


def _compared(args: argparse.Namespace
              ) -> tuple[SummaryDiff, list[FindingChange], PathChange | None] | None:
    """BASE and NEW compared: the summaries' diff, the findings' and the critical paths' changes; None
    when traces of a side could not be read (each said on stderr)."""
    from torchprof_args.analysis.collect.discover import choose_cycle, expand
    from torchprof_args.analysis.critical_path.compare import compare_paths
    from torchprof_args.analysis.diagnose.changes import diff_findings
    from torchprof_args.analysis.tools.diff import diff_summaries
    from torchprof_args.commands.cycles import cycle_summaries

    sides, diagnoses, paths = [], [], []
    for side in (args.base, args.new):
        cycles, got = cycle_summaries([side], args, None)
        if got.errors:
            return None
        sides.append([s for _, summaries in cycles for s in summaries])
        files, label = choose_cycle(expand([side]), None)
        found, path, _ = _diagnosis(files, args, label or side)
        diagnoses.append(found)
        paths.append(path)
    return diff_summaries(*sides), diff_findings(*diagnoses), compare_paths(paths[0], paths[1])


def _diff_document(args: argparse.Namespace) -> tuple[Any, int]:
    """``diff --json``'s document (plain JSON values) and the exit status: what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.jsonout import finite

    compared = _compared(args)
    if compared is None:
        raise CommandError("traces of BASE or NEW could not be read; diff compares whole sides",
                           ExitStatus.PARTLY_FAILED)
    result, findings, path_changes = compared
    return finite({**result, "findings": findings, "critical_path": path_changes}), ExitStatus.OK


def _diff(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.critical_path.compare import format_path_diff
    from torchprof_args.analysis.diagnose.changes import format_findings_diff
    from torchprof_args.analysis.jsonout import print_json
    from torchprof_args.analysis.tools.diff import format_diff, slower_than

    compared = _compared(args)
    if compared is None:
        return ExitStatus.PARTLY_FAILED
    result, findings, path_changes = compared
    slower = None if args.fail_above is None else slower_than(result, args.fail_above)
    if args.fail_above is not None and slower is None:
        raise CommandError("--fail-above needs BASE's step time, and BASE has no profiled step "
                           "(ProfilerStep#N): compare traces recorded with prof.step()")
    if args.json:
        print_json({**result, "findings": findings, "critical_path": path_changes})
    else:
        print(format_diff(result, args.base, args.new, rows=args.rows), end="")
        print("\n".join(format_findings_diff(findings)))
        print("\n".join(format_path_diff(path_changes)), flush=True)
    if slower:
        shown = ", ".join(slower[:6]) + (f" and {len(slower) - 6} more" if len(slower) > 6 else "")
        raise CommandError(f"slower by more than {args.fail_above:g} % (--fail-above): {shown}; find why in "
                           "the diff above", ExitStatus.REGRESSION)
    return 0


def _split(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.collect.discover import expand
    from torchprof_args.analysis.tools.split import split_trace

    if args.max_mb <= 0:
        raise CommandError(f"--max-mb must be a positive number of megabytes, got {args.max_mb:g}")
    files = expand(args.traces)
    if args.output and len(files) > 1:
        raise CommandError(f"-o/--output names one folder, but {len(files)} traces were given; leave it out "
                         "(each trace is split into <trace>.split/)")
    for f in files:
        for p in split_trace(f, args.max_mb, args.output, progress=not args.no_progress):
            print(f"{p}\t{p.stat().st_size / 1e6:.2f} MB")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.collect.discover import expand, group_by_cycle
    from torchprof_args.analysis.tools.merge import merge_traces

    cycles = group_by_cycle(expand(args.inputs))
    if len(cycles) > 1:
        labels = ", ".join(c.label for c in cycles[:4]) + (" ..." if len(cycles) > 4 else "")
        raise CommandError(f"the input holds {len(cycles)} profiled cycles ({labels}); merge one cycle "
                           "folder at a time")
    result = merge_traces(cycles[0].files, args.output, progress=not args.no_progress,
                          align_clocks=args.align_clocks)
    events = ", ".join(f"rank {r}: {n:,}" for r, n in sorted(result["ranks"].items()))
    print(f"wrote {result['output']} ({events} events)")
    if result["clock"] is not None and (clock := result["clock"].line()):
        print(clock)
    return 0


def register(subparsers: Subparsers) -> None:
    """Add the trace toolkit's sub-commands to ``torchprof``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--no-progress", action="store_true", help="no progress bars")
    reading = argparse.ArgumentParser(add_help=False)
    reading.add_argument("--reparse", action="store_true",
                         help="parse every trace even where a matching summary sidecar exists")
    summary_command.register(subparsers, [common, reading])
    _register_report_and_diff(subparsers, [common, reading])
    _register_tools(subparsers, common)


def _register_report_and_diff(subparsers: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "report", parents=parents, help="self-contained HTML report of many ranks' traces",
        description="Write an HTML report (inline SVG, no scripts) per profiled cycle: distributions over "
        "ranks, a rank x step heatmap of step time, histograms of step time, GPU idle and overlap, the "
        "straggler table, kernel-type breakdown and top kernels of the slowest, median and fastest rank.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE_OR_DIR", help=INPUTS_HELP)
    p.add_argument("-o", "--output", required=True, help="report .html to write")
    p.add_argument("--top", type=top_count, default=30, help="kernels per top list (default 30)")
    p.add_argument("--slowest", type=positive_int, default=5,
                   help="slowest ranks listed when none is a straggler")
    p.set_defaults(func=_report, document=_report_document)

    p = subparsers.add_parser(
        "diff", parents=parents, help="compare two traces, cycles or runs: what changed and what it costs",
        description="Step time, GPU idle/compute/overlap and kernel time per class side by side with "
        "deltas; operators and kernels added, removed or changed in calls or time per rank and step, sorted "
        "by the time they cost or save (HTA TraceDiff's per-name rules). Each side: traces, a cycle folder "
        "or a run folder.",
    )
    p.add_argument("base", metavar="BASE", help="the reference: " + INPUTS_HELP.replace("folders", "folder"))
    p.add_argument("new", metavar="NEW", help="compared with BASE")
    p.add_argument("--json", action="store_true", help="the whole comparison as one JSON object")
    p.add_argument("--rows", type=positive_int, default=15,
                   help="rows per table in the text output (default 15)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="processes that parse traces (default: the CPUs)")
    p.add_argument("--fail-above", type=positive_float, default=None, metavar="PCT",
                   help="a CI gate: after the diff, exit with status 3 naming each step figure (mean over "
                   "ranks, slowest rank's) slower by more than PCT percent, and each operator or kernel "
                   "whose added time per step is more than PCT percent of BASE's mean step")
    p.set_defaults(func=_diff, document=_diff_document)


def _register_tools(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "split", parents=[common], help="cut huge traces into standalone traces of at most N MB",
        description="Split by ProfilerStep (and by time inside oversized steps); every piece keeps the "
        "metadata.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE_OR_DIR", help=INPUTS_HELP)
    p.add_argument("--max-mb", type=float, required=True, help="largest piece, in MB of JSON")
    p.add_argument("-o", "--output", default=None,
                   help="output folder for one trace (default: TRACE's name + .split)")
    p.set_defaults(func=_split)

    p = subparsers.add_parser(
        "merge", parents=[common],
        help="merge one cycle's rank traces into one timeline with 'rank N' tracks",
        description="Merge the traces of one cycle (a cycle folder, a run folder with one cycle, or files), "
        "aligning clocks with baseTimeNanoseconds and, on several hosts, with each host's clock offset "
        "estimated at the collectives the ranks share (from the sidecars, else the traces parsed).",
    )
    p.add_argument("inputs", nargs="+", metavar="TRACE_OR_DIR", help=INPUTS_HELP + " (one cycle)")
    p.add_argument("-o", "--output", required=True, help="merged trace (.json or .json.gz)")
    add_clock_option(p)
    p.set_defaults(func=_merge)
