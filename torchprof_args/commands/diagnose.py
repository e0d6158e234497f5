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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchprof_args.capture.flags.types import positive_float
from torchprof_args.commands.common import Subparsers, add_clock_option
from torchprof_args.device_peaks import DTYPES
from torchprof_args.errors import CommandError, ExitStatus
from torchprof_args.naming import METRICS_FILENAME

if TYPE_CHECKING:
    from torchprof_args.analysis.diagnose.documents import JobDiagnosis
    from torchprof_args.analysis.diagnose.expert_tokens import ExpertTokens
    from torchprof_args.analysis.diagnose.step_timers import FormulaFlops

__all__ = ["register"]


def _diagnosis(args: argparse.Namespace) -> tuple[JobDiagnosis, int]:
    """The cycle's diagnosis and the exit status (some traces unreadable: PARTLY_FAILED)."""
    from torchprof_args.analysis.collect.trace_results import CRITICAL_PATH, DIAGNOSIS, MEMORY
    from torchprof_args.analysis.diagnose.job_findings import diagnose
    from torchprof_args.commands.cycles import cycle_results

    # memory_imbalance compares the memory parts the sidecars keep (`torchprof mem` parses for them)
    cycle_text, got = cycle_results([args.path], args, (DIAGNOSIS, CRITICAL_PATH, MEMORY.if_stored()))
    done = [r for r in got.results if r is not None and r.diagnosis is not None]
    graphs = [r.critical_path for r in done if r.critical_path is not None]
    doc = diagnose([r.diagnosis for r in done if r.diagnosis is not None], args.path, cycle_text,
                   peak_tflops=args.peak_tflops, dtype=args.peak_dtype,
                   paths=graphs if len(graphs) == len(done) else None, memory=[m for _, m in got.memory],
                   align_clocks=args.align_clocks, formula=_formula(args, [r.path for r in done]),
                   expert_tokens=_expert_tokens(args, [r.path for r in done]))
    return doc, ExitStatus.PARTLY_FAILED if got.errors else ExitStatus.OK


def _formula(args: argparse.Namespace, traces: list[Path]) -> FormulaFlops | None:
    """The step timers' FLOPs (``mfu_disagreement``): from ``--metrics``, else the ``metrics.jsonl``
    beside the traces; None where there is none or it logs no ``throughput``."""
    from torchprof_args.analysis.diagnose.step_timers import formula_beside, formula_flops

    if not args.metrics:
        return formula_beside(traces, args.roots)
    path = Path(args.metrics)
    if path.is_dir():
        path = path / METRICS_FILENAME
    try:
        return formula_flops(path, traces)
    except OSError as err:
        raise CommandError(f"--metrics {args.metrics}: {err.strerror or err}: give a run's metrics.jsonl "
                           "(or its --metrics-dir)") from None
    except ValueError as err:
        raise CommandError(f"{path}: not a readable metrics.jsonl ({err})") from None


def _expert_tokens(args: argparse.Namespace, traces: list[Path]) -> ExpertTokens | None:
    """The framework's tokens per expert (``expert_imbalance``): from ``--expert-tokens``, else the
    folder beside the traces; None where there is none."""
    from torchprof_args.analysis.diagnose.expert_tokens import (
        expert_tokens_beside,
        expert_tokens_folder,
        read_expert_tokens,
    )

    if not args.expert_tokens:
        problems: list[str] = []
        found = expert_tokens_beside(traces, args.roots, problems)
        for problem in problems:  # one line each; the diagnosis goes on without them
            print(f"torchprof diagnose: tokens per expert not read: {problem}", file=sys.stderr)
        return found
    folder = Path(args.expert_tokens)
    folder = expert_tokens_folder(folder) or folder
    try:
        return read_expert_tokens(folder, traces)
    except OSError as err:
        raise CommandError(f"--expert-tokens {args.expert_tokens}: {err.strerror or err}: give a cycle "
                           "folder (its expert_tokens/) or Megatron-LM's tokens_per_expert folder (or its "
                           "--save folder)") from None
    except ValueError as err:
        raise CommandError(str(err)) from None


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s document (plain JSON values) and the exit status: what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.jsonout import finite

    doc, status = _diagnosis(args)
    return finite(doc), status


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.render.diagnosis import format_diagnosis

    if args.json:
        out, status = _document(args)
        print(json.dumps(out))
        return status
    doc, status = _diagnosis(args)
    print(format_diagnosis(doc))
    return status


def register(subparsers: Subparsers) -> None:
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
    add_clock_option(p)
    p.add_argument("--workers", type=int, default=None,
                   help="decoding processes per trace (default: as summary)")
    p.add_argument("--peak-tflops", type=positive_float, default=None, metavar="TFLOPS",
                   help="the GPU's dense peak TFLOP/s for low_mfu (default: the device table, by the "
                        "trace's device name)")
    p.add_argument("--peak-dtype", choices=DTYPES, default="bf16",
                   help="which of the table's peaks low_mfu compares with (default: bf16)")
    p.add_argument("--metrics", default=None, metavar="FILE",
                   help="the run's metrics.jsonl (or its --metrics-dir), whose step timers' FLOPs "
                        "mfu_disagreement compares with the traces' (default: one beside the traces, in "
                        "the cycle folder or up to two folders above)")
    p.add_argument("--expert-tokens", default=None, metavar="DIR",
                   help="the tokens per expert expert_imbalance names: a cycle folder's expert_tokens "
                        "(torchtitan's MoE layers, recorded with the traces), or Megatron-LM's "
                        "tokens_per_expert folder (--save-tokens-per-expert-interval; or its --save folder) "
                        "(default: one beside the traces, in the cycle folder or up to two folders above)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run, document=_document)

