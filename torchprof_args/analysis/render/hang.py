"""The text of ``torchprof hang``: where each rank is (its stacks, grouped), the flight recorder's
answer per process group (the collective some ranks never joined, who issued it, each rank's last
collectives), why each rank dumped, and PyTorch's own analyzer output, for
:func:`~torchprof_args.analysis.tools.hang.analyse_dumps`'s result."""

from __future__ import annotations

import datetime
from typing import Any

import msgspec

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment
from torchprof_args.analysis.analyzers.where import format_where

__all__ = ["format_hang"]


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _collective(view: dict[str, Any] | None) -> str:
    if view is None:
        return "none recorded"
    return f"{view['collective']} #{view['seq']} (input sizes {view['input_sizes']})"


def _finding_lines(finding: dict[str, Any]) -> list[str]:
    desc = finding["pg_desc"].split(":", 1)[-1]
    group = f"process group {finding['pg']}" + (f" ({desc})" if desc not in ("", "undefined") else "")
    what = f"{finding['collective']} #{finding['seq']} (input sizes {finding['input_sizes']})"
    lines = []
    if finding["missing_ranks"]:
        lines.append(f"{group}: rank{'s' if len(finding['missing_ranks']) > 1 else ''} "
                     f"{_ranks(finding['missing_ranks'])} did not join {what}; rank"
                     f"{'s' if len(finding['joined']) != 1 else ''} {_ranks(finding['joined'])} issued it "
                     f"and {'wait' if len(finding['joined']) != 1 else 'waits'} in it")
    for rank in finding["mismatched_ranks"]:
        lines.append(f"{group}: rank {rank} issued a different collective at {what}: "
                     f"{finding['ranks'][rank]['mismatch']}")
    for rank, about in finding["ranks"].items():
        if not about["dumped"]:
            lines.append(f"  rank {rank}: no dump (it may have died or been killed before it could dump)")
            continue
        last, completed = about["last_in_group"], about["last_completed_in_group"]
        done = ("completed" if completed and last and completed["seq"] == last["seq"] else
                f"its recorder's last completed: #{completed['seq']}" if completed else "none completed")
        lines.append(f"  rank {rank}: last collective it issued in the group: {_collective(last)}; {done}")
        lines += [f"      {frame}" for frame in (last or {}).get("frames", [])[:4]]
        recorded = about["last_recorded"]
        if recorded != last:
            lines.append(f"  rank {rank}: last collective it issued anywhere: {_collective(recorded)} in "
                         f"process group {recorded['pg'] if recorded else '-'}, "
                         f"state {recorded['state'] if recorded else '-'}")
            lines += [f"      {frame}" for frame in (recorded or {}).get("frames", [])[:4]]
    if finding["frames"]:
        lines.append(f"  where rank{'s' if len(finding['joined']) != 1 else ''} {_ranks(finding['joined'])} "
                     "issued it:")
        lines += [f"      {frame}" for frame in finding["frames"][:6]]
    return lines


def _recorder_lines(recorder: dict[str, Any]) -> list[str]:
    lines = [f"{recorder['backend']} flight recorder: dumps of ranks {_ranks(recorder['ranks'])} "
             f"(dump format {recorder['version']}); {recorder['matched']} collectives matched on every rank"]
    if recorder["missing_dumps"]:
        lines.append(f"NO DUMP from ranks {_ranks(recorder['missing_dumps'])}: they never dumped (killed, "
                     "crashed, or stuck where no dump is taken): look at them first")
    for finding in recorder["findings"]:
        lines += _finding_lines(finding)
    if not recorder["findings"] and not recorder["missing_dumps"]:
        lines.append("every recorded collective was joined by every rank of its group: the hang is not a "
                     "missing collective (look at the ranks' stacks: torchprof pyspy, py-spy dump)")
    lines += [f"note: {note}" for note in recorder["notes"]]
    clock = msgspec.convert(recorder["clock"], ClockAlignment).line() if recorder.get("clock") else None
    issued = recorder.get("last_issued_s") or {}
    if len(issued) > 1:
        lines += ["", "When each rank issued its last collective (ms before the last rank did; the first "
                      "to go quiet first)"]
        lines.append("  " + "  ".join(f"rank {rank}: {seconds * 1e3:+.2f}"
                                      for rank, seconds in sorted(issued.items(), key=lambda kv: kv[1])))
    lines += [clock] if clock else []
    lines += ["", "Last collectives per process group (enqueued / completed, by sequence number)"]
    for pg, ranks in recorder["status"].items():
        cells = "  ".join(f"rank {rank}: {s.get('enqueued', '?')}/{s.get('completed', '?')}"
                          for rank, s in ranks.items())
        lines.append(f"  pg {pg:<8} {cells}")
    return lines


def format_hang(report: dict[str, Any], pytorch_output: bool = True) -> str:
    """The text ``torchprof hang`` prints.

    Args:
        report: :func:`~torchprof_args.analysis.tools.hang.analyse_dumps`'s result.
        pytorch_output: end with PyTorch's own analyzer output (``--brief`` leaves it out).

    Returns:
        The text, ending with a newline.
    """
    lines = [f"torchprof hang: {report['directory']}", ""]
    if report.get("where"):
        lines += ["Where each rank is (main thread, innermost frame first; the odd group first)"]
        lines += [f"  {line}" for line in format_where(report["where"])] + [""]
    lines += [f"note: {problem}" for problem in report.get("stacks_problems", [])]
    for recorder in report["recorders"]:
        lines += _recorder_lines(recorder) + [""]
    if report["dumped"]:
        lines.append("Why each rank dumped")
        for rank, info in report["dumped"].items():
            stamp = info.get("time")
            when = datetime.datetime.fromtimestamp(stamp).strftime("%H:%M:%S") if stamp else "?"
            pid = f", pid {info['pid']}" if info.get("pid") is not None else ""  # none: the debug server's
            lines.append(f"  rank {rank} ({info.get('host')}{pid}, {when}): {info.get('reason')}")
        lines.append("")
    if pytorch_output:
        for recorder in report["recorders"]:
            lines.append("PyTorch's analyzer (torch.distributed.flight_recorder), "
                         f"{recorder['backend']} dumps:")
            lines += [f"  {line}" for text in recorder["pytorch_analyzer"] for line in text.splitlines()]
            if not recorder["pytorch_analyzer"]:
                lines.append("  (nothing to report)")
    return "\n".join(lines).rstrip() + "\n"
