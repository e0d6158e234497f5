"""``torchprof diagnose PATH``: what to fix, ranked by the step time it would save.

    torchprof diagnose prof/                  # the latest profiled cycle of a run folder
    torchprof diagnose prof/ --cycle 120      # the cycle whose traces start at iteration 120
    torchprof diagnose prof/iter000120-000121/ --json
    torchprof diagnose rank0.pt.trace.json.gz

Prints at most about 30 lines: per finding, one sentence, the saving in ms per step with how it was
bounded, the evidence with a timestamp to open in Perfetto (the trace's own clock, in us), and the
usual remedy; then what the traces cannot tell and which flag would record it.  Reads each trace's
summary sidecar (written when the trace was published, or by ``torchprof summary
--write-sidecars``) when it matches, else parses the trace.  ``--json``: the versioned schema of
docs/guides/diagnose.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchprof_args.commands.common import guard
from torchprof_args.device_peaks import DTYPES
from torchprof_args.errors import TraceError
from torchprof_args.flags.types import positive_float

__all__ = ["format_diagnosis", "register"]

#: the text output's budget of lines (header and gaps included).
MAX_LINES = 30


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _ranks(ranks: list[int], of: int) -> str:
    if not ranks:
        return "ranks -"
    if len(ranks) == of and of > 2:
        return f"all {of} ranks"
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{' ...' if len(ranks) > 8 else ''}"


def _evidence(finding: dict[str, Any]) -> str:
    """The evidence in one line: its scalars and small lists, then the Perfetto timestamp."""
    parts = []
    ev = finding.get("evidence") or {}
    for key, value in ev.items():
        if key.startswith("perfetto"):
            continue
        if isinstance(value, dict):
            inner = ", ".join(f"{k} {v}" for k, v in list(value.items())[:4])
            parts.append(f"{key}: {inner}")
        elif isinstance(value, list):
            names = [v.get("name", v) if isinstance(v, dict) else v for v in value[:3]]
            parts.append(f"{key}: {'; '.join(str(n)[:60] for n in names)}")
        elif value is not None:
            parts.append(f"{key} {value}")
    text = "; ".join(parts)
    if len(text) > 200:
        text = text[:197] + "..."
    ts = ev.get("perfetto_ts_us")
    if ts is not None:
        rank = ev.get("perfetto_rank", ev.get("worst_rank", (finding.get("ranks") or [None])[0]))
        text += f" | Perfetto: rank {rank} at ts {ts:,.0f} us"
    return text


def _gap_lines(gaps: list[dict[str, Any]]) -> list[tuple[tuple[str | None, str], list[str]]]:
    """Gaps with the same flag and reason on one line: ((flag, reason), kinds)."""
    grouped: dict[tuple[str | None, str], list[str]] = {}
    for gap in gaps:
        kinds = grouped.setdefault((gap.get("flag"), gap["reason"].rstrip(".")), [])
        if gap["kind"] not in kinds:
            kinds.append(gap["kind"])
    return list(grouped.items())


def format_diagnosis(doc: dict[str, Any], max_lines: int = MAX_LINES) -> str:
    """The text ``torchprof diagnose`` prints for :func:`~.diagnose.diagnose`'s result."""
    findings, gaps = doc["findings"], doc.get("gaps") or []
    head = (f"torchprof diagnose: {doc['ranks']} rank{'s' if doc['ranks'] != 1 else ''}, step "
            f"{_ms(doc['step_ms'])}" + (f", {doc['cycle']}" if doc.get("cycle") else "")
            + f": {len(findings)} finding{'s' if len(findings) != 1 else ''}")
    lines = [head]
    if not findings:
        lines.append("  nothing above the documented thresholds (docs/guides/diagnose.md)")
    budget = max_lines - 1 - min(len(_gap_lines(gaps)), 4) - 1
    for n, f in enumerate(findings, 1):
        if len(lines) + 4 > budget and n < len(findings):
            lines.append(f"  ... {len(findings) - n + 1} more finding(s) in --json")
            break
        lines.append(f"{n}. {f['kind']}: saves up to {_ms(f['saving_ms_per_step'])}/step "
                     f"({100 * f['share_of_step']:.1f} % of the step), {_ranks(f['ranks'], doc['ranks'])}")
        lines.append(f"   {f['summary']}")
        lines.append(f"   evidence: {_evidence(f)}")
        lines.append(f"   bound: {f['saving_bound']}. Fix: {f['remedy']}")
    for (flag, reason), kinds in _gap_lines(gaps)[: max(max_lines - len(lines), 0)]:
        how = f"record with {flag}" if flag else "no flag records it"
        lines.append(f"  to see {', '.join(kinds)}, {how} ({reason})")
    return "\n".join(lines[:max_lines])


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.collect.discover import choose_cycle, expand
    from torchprof_args.analysis.collect.pool import collect
    from torchprof_args.analysis.collect.trace_results import DIAGNOSIS
    from torchprof_args.analysis.decode.loader import release_memory_eagerly
    from torchprof_args.analysis.diagnose.job import diagnose
    from torchprof_args.analysis.jsonout import finite

    release_memory_eagerly()
    files, cycle_text = choose_cycle(expand([args.path]), args.cycle)
    got = collect(files, parts=(DIAGNOSIS,), reparse=args.reparse, workers=args.workers,
                  progress=not args.no_progress)
    if not got.diagnoses:
        raise TraceError(got.errors[0] if len(got.errors) == 1 else
                         f"none of the {len(files)} traces could be read ({got.errors[0]})")
    for error in got.errors:
        print(f"torchprof diagnose: {error}", file=sys.stderr)
    doc = finite(diagnose(got.diagnoses, args.path, cycle_text, peak_tflops=args.peak_tflops,
                          dtype=args.peak_dtype))
    print(json.dumps(doc) if args.json else format_diagnosis(doc))
    return 1 if got.errors else 0


def register(subparsers: Any) -> None:
    """Add ``torchprof diagnose``."""
    p = subparsers.add_parser(
        "diagnose", help="what to fix: findings ranked by the step time each would save",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="a trace, a cycle folder, or a run folder (its latest cycle)")
    p.add_argument("--cycle", type=int, default=None, metavar="ITER",
                   help="the cycle whose traces start at this iteration (default: the latest)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object: version, path, ranks, step_ms, findings (sorted by saving), gaps")
    p.add_argument("--reparse", action="store_true", help="parse the traces even where a sidecar matches")
    p.add_argument("--workers", type=int, default=None,
                   help="decoding processes per trace (default: as summary)")
    p.add_argument("--peak-tflops", type=positive_float, default=None, metavar="TFLOPS",
                   help="the GPU's dense peak TFLOP/s for low_mfu (default: the device table, by the "
                        "trace's device name)")
    p.add_argument("--peak-dtype", choices=DTYPES, default="bf16",
                   help="which of the table's peaks low_mfu compares with (default: bf16)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=guard(_run, "diagnose", error_status=2))

