"""The file contract: every versioned format the job writes and the tools read, in one place.

The in-job side (:mod:`torchprof_args.capture`) and the offline side (:mod:`torchprof_args.analysis`)
meet only at files.  Their names and folders are :mod:`torchprof_args.naming`'s; what is inside each
versioned file, and what a reader does with a version it does not read, is declared here, one
:class:`FileFormat` each, with its history.  A format's version is bumped whenever its content or
its numbers change (its history line says why); ``tests/test_file_contract.py`` writes a file of
another version of each and checks the reader's answer: read again from the trace, or refused in
one line naming the file.  ARCHITECTURE.md ("The two sides and the files between them") is the map.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEBUG_SERVER_FR", "DIAGNOSIS", "EXPERT_TOKENS", "FINDINGS", "FORMATS", "KERNEL_MODULES", "MEMORY",
           "METRICS_RUN", "ONDEMAND", "PATHS", "SIDECAR", "STACKS", "FileFormat"]


@dataclass(frozen=True)
class FileFormat:
    """One versioned file (or part of one) of the contract.

    Attributes:
        name: the ``format`` the file says it is (where it carries one), else what it is.
        version: the version this torchprof-args writes and reads.
        files: where such files are (:mod:`torchprof_args.naming`'s names).
        schema: the module and type that define its fields.
        other_version: what a reader does with a file of another version.
        history: why each version after the first was made, newest first.
    """

    name: str
    version: int
    files: str
    schema: str
    other_version: str
    history: tuple[str, ...] = ()


SIDECAR = FileFormat(
    "torchprof-summary", 7, "<cycle>/summaries/<stem>.summary.json",
    "analysis/collect/sidecar.py (the header: format, version, trace, left_out; one key per part)",
    "ignored: the trace is parsed again; the command's last line counts such sidecars by version",
    ("7: the compiled code's generated kernels by module (modules, module_map)",
     "6: the summary's work per step (work_mean_us: the cross-rank view's straggler figure)",
     "5: the summary's compiled code (regions, Triton kernels on the roofline)",
     "4: the summary's step by FSDP2 phase (fsdp_step)", "3: the summary's FSDP2 annotations"))
DIAGNOSIS = FileFormat(
    "the sidecar's diagnosis part", 8, "the sidecar's `diagnosis` key",
    "analysis/diagnose/documents.py RankDiagnosis", "ignored: the trace is parsed again",
    ("8: inductor's kernel FLOPs in low_mfu's inputs", "7: FSDP2 remedies", "6: an all-to-all's row_bytes",
     "5: gloo reduce_scatter named"))
PATHS = FileFormat(
    "the sidecar's critical-path part", 3, "the sidecar's `critical_path` key",
    "analysis/critical_path/reduced.py RankPaths", "ignored: the trace is parsed again",
    ("3: FSDP2 phases (Piece.by_phase, RankPaths.record_phases)",
     "2: gloo collectives named by their c10d operator (reduce_scatter)"))
MEMORY = FileFormat(
    "the sidecar's memory part", 4, "the sidecar's `memory` key",
    "analysis/memory/categories.py MemoryPart", "ignored: the trace is parsed again",
    ("4: fsdp2", "3: a site per category", "2: FSDP2 parameters sized by their shards"))
FINDINGS = FileFormat(
    "torchprof diagnose --json", 1, "standard output (and `torchprof mcp`'s diagnose tool)",
    "analysis/diagnose/documents.py JobDiagnosis",
    "its `version` field tells a consumer which schema it reads")
METRICS_RUN = FileFormat(
    "metrics.jsonl", 1, "<metrics dir>/metrics.jsonl (one MetricsRecord per line, run markers)",
    "shared/metrics_log.py MetricsRecord, RunMarker",
    "a run marker of a newer version is refused in one line naming the file and line; older ones are read")
STACKS = FileFormat(
    "torchprof-stacks", 1, "<profile dir>/flight_recorder/stacks_rank<R>.json, on request "
    "<profile dir>/stacks/answers/<id>/stacks_rank<R>.json",
    "shared/stacks_file.py", "refused in one line naming the file and both versions")
ONDEMAND = FileFormat(
    "on-demand request", 1, "<control dir>/requests/<id>.json, answers/<id>.json",
    "capture/ondemand/protocol.py", "the request is refused; its answer names both versions")
DEBUG_SERVER_FR = FileFormat(
    "torchprof-debug-server-fr", 1, "<profile dir>/debug_server/torchprof_fr_trace_<time>.txt",
    "capture/runtime/debug_server/pages.py (written), analysis/tools/debug_dumps.py (read)",
    "skipped by `torchprof hang`, with the reason in one line")
EXPERT_TOKENS = FileFormat(
    "torchprof-expert-tokens", 1, "<cycle>/expert_tokens/<stem>.expert_tokens.json (one per traced rank "
    "and window: its routed tokens per expert, layer and step)",
    "shared/expert_tokens_file.py", "refused in one line naming the file and both versions")

KERNEL_MODULES = FileFormat(
    "torchprof-kernel-modules", 1, "<profile dir>/compiled_modules/<trace stem>.json",
    "shared/kernel_modules.py KernelModules (written by capture/runtime/inductor/kernel_modules.py)",
    "refused in one line naming the file and both versions: compiled code keeps its region's modules")

#: every format of the contract (the test of each one's other version iterates over these).
FORMATS = (SIDECAR, DIAGNOSIS, PATHS, MEMORY, FINDINGS, METRICS_RUN, STACKS, ONDEMAND, DEBUG_SERVER_FR,
           EXPERT_TOKENS, KERNEL_MODULES)
