"""``torchprof mcp``'s tools: one per command, each the command line it stands for.

A tool's arguments become the command's own argv (``diagnose PATH --json --cycle 120 ...``), parsed
by the ``torchprof`` parser itself, so the defaults and checks are the command line's; the document
is the command's ``--json`` (its ``document`` function, the one the command prints).  The argv is
also the pointer a cut result carries: ``torchprof <argv>`` prints the whole document.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchprof_args.device_peaks import DTYPES
from torchprof_args.mcp_server import schemas

__all__ = ["TOOLS", "Tool"]

_PATH = {"type": "string", "description": "a trace file, a cycle folder or a run folder (its latest cycle), "
                                          "absolute or relative to the server's first root"}
_PATHS = {"type": "array", "items": {"type": "string"}, "minItems": 1,
          "description": "trace files, cycle folders or run folders, absolute or relative to the first root"}
_CYCLE = {"type": "integer", "minimum": 0,
          "description": "the cycle whose traces start at this iteration (default: the latest)"}
_ALIGN = {"type": "boolean", "default": True,
          "description": "align several hosts' clocks at the collectives they share (false: as written)"}
_REPARSE = {"type": "boolean", "default": False,
            "description": "parse the traces even where a summary sidecar matches"}


@dataclass(frozen=True)
class Tool:
    """One tool: its name (the command's), what it says, its schemas, and its command line.

    Attributes:
        name: the command's name, the tool's.
        description: what the agent reads to choose it.
        properties: the arguments' JSON schemas (the input schema's ``properties``).
        required: the arguments without a default.
        paths: the arguments that are paths (a string or a list of them): confined to the roots.
        argv: arguments (paths resolved) and the server's cache folder -> the command's argv.
        output: the document's JSON schema, built when the tools are listed (it imports the analysis).
    """

    name: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]
    paths: tuple[str, ...]
    argv: Callable[[dict[str, Any], str], list[str]]
    output: Callable[[], dict[str, Any]] = field(repr=False)

    def input_schema(self) -> dict[str, Any]:
        """The arguments' JSON schema (no other argument is accepted)."""
        return {"type": "object", "properties": self.properties, "required": list(self.required),
                "additionalProperties": False}


def _options(args: dict[str, Any], flags: dict[str, str]) -> list[str]:
    """``--flag=VALUE`` for each argument given (a list: the flag repeated; a boolean: the flag alone when
    true, ``no-`` flags when false).  One word each, so that a value cannot pass for an option."""
    out: list[str] = []
    for key, flag in flags.items():
        value = args.get(key)
        if value is None:
            continue
        if isinstance(value, bool):
            if value == flag.startswith("--no-"):
                continue
            out.append(flag)
        elif isinstance(value, list):
            out += [f"{flag}={item}" for item in value]
        else:
            out.append(f"{flag}={value}")
    return out


_CYCLE_FLAGS = {"cycle": "--cycle", "reparse": "--reparse"}
_CLOCK_FLAGS = {"align_clocks": "--no-align-clocks"}


def _diagnose_schema() -> dict[str, Any]:
    from torchprof_args.analysis.diagnose.documents import JobDiagnosis

    return schemas.struct_schema(JobDiagnosis, "`torchprof diagnose --json` (docs/guides/diagnose.md)")


def _critical_path_schema() -> dict[str, Any]:
    from torchprof_args.analysis.critical_path.path import CriticalPathDoc

    return schemas.struct_schema(CriticalPathDoc,
                                 "`torchprof critical-path --json` (docs/guides/critical-path.md)")


def _mem_schema() -> dict[str, Any]:
    from torchprof_args.analysis.memory.report import MemoryReport

    return schemas.struct_schema(MemoryReport, "`torchprof mem --json` (docs/guides/out-of-memory.md)")


def _collectives_schema() -> dict[str, Any]:
    from torchprof_args.analysis.analyzers.collective_match import CycleCollectives

    return schemas.struct_schema(CycleCollectives,
                                 "`torchprof collectives --json` (docs/guides/collectives.md)")


def _brief_schema() -> dict[str, Any]:
    from torchprof_args.analysis.tools.brief import Brief

    return schemas.struct_schema(Brief, "`torchprof brief --json` (docs/guides/brief.md)")


def _summary_schema() -> dict[str, Any]:
    from torchprof_args.analysis.summary import CrossRankView, Summary

    return schemas.summary_schema(Summary, CrossRankView)


def _object(description: str, keys: dict[str, str]) -> Callable[[], dict[str, Any]]:
    """The schema of a plain-dict document: its top-level keys named, any values."""
    def build() -> dict[str, Any]:
        return {"type": "object", "description": description,
                "properties": {**{k: {"description": v} for k, v in keys.items()}, "cut": schemas.CUT_SCHEMA}}
    return build


TOOLS: tuple[Tool, ...] = (
    Tool("brief", "Start here: one profiled cycle (or a run's latest) in at most max_tokens tokens, the most "
         "important first: the step time and its trend, the top findings with their savings and ranks, the "
         "odd ranks out, the critical path's top items, the memory peak, a hang's odd rank, what was not "
         "recorded. The document of `torchprof brief --json`: text, tokens, dropped.",
         {"path": _PATH, "cycle": _CYCLE, "reparse": _REPARSE, "align_clocks": _ALIGN,
          "max_tokens": {"type": "integer", "minimum": 1,
                         "description": "the most tokens the text may take (cl100k_base; default 2000)"}},
         ("path",), ("path",),
         lambda a, _: ["brief", a["path"], "--json", *_options(a, {
             **_CYCLE_FLAGS, **_CLOCK_FLAGS, "max_tokens": "--max-tokens"})],
         _brief_schema),
    Tool("diagnose", "What to fix in one profiled cycle: findings ranked by the step time each would "
         "save (ms per step, how it was bounded, evidence with trace timestamps, the remedy), then what the "
         "traces cannot tell. The document of `torchprof diagnose --json`.",
         {"path": _PATH, "cycle": _CYCLE, "reparse": _REPARSE, "align_clocks": _ALIGN,
          "peak_tflops": {"type": "number", "exclusiveMinimum": 0,
                          "description": "the GPU's dense peak TFLOP/s for low_mfu (default: by device "
                                         "name)"},
          "peak_dtype": {"type": "string", "enum": list(DTYPES),
                         "description": "which peak low_mfu compares with (default bf16)"}},
         ("path",), ("path",),
         lambda a, _: ["diagnose", a["path"], "--json", *_options(a, {
             **_CYCLE_FLAGS, **_CLOCK_FLAGS, "peak_tflops": "--peak-tflops", "peak_dtype": "--peak-dtype"})],
         _diagnose_schema),
    Tool("critical-path", "The longest path through each step across all ranks of one cycle (time by rank, "
         "category, operator and kernel) and what-if answers: the step the dependency graph predicts, e.g. "
         "'no data loader', 'rank 3 like the median', 'communication fully overlapped', 'gemm 2x faster'. "
         "The document of `torchprof critical-path --json`.",
         {"path": _PATH, "cycle": _CYCLE, "reparse": _REPARSE, "align_clocks": _ALIGN,
          "what_if": {"type": "array", "items": {"type": "string"},
                      "description": "questions answered with the predicted step "
                                     "(docs/guides/critical-path.md)"}},
         ("path",), ("path",),
         lambda a, _: ["critical-path", a["path"], "--json", *_options(a, {
             **_CYCLE_FLAGS, **_CLOCK_FLAGS, "what_if": "--what-if"})],
         _critical_path_schema),
    Tool("summary", "Per-trace summaries (steps, GPU idle/compute/communication/overlap, top kernels "
         "and operators, memory) and, per cycle of several ranks, the cross-rank view (distributions, "
         "slowest and fastest ranks). `torchprof summary --json`'s lines as {\"lines\": [...]}.",
         {"paths": _PATHS, "reparse": _REPARSE,
          "top": {"type": "integer", "minimum": 0, "description": "entries in the top-N lists (default 30)"},
          "slowest": {"type": "integer", "minimum": 1,
                      "description": "slowest and fastest ranks in the cross-rank view (default 5)"}},
         ("paths",), ("paths",),
         lambda a, _: ["summary", *a["paths"], "--json", *_options(a, {
             "reparse": "--reparse", "top": "--top", "slowest": "--slowest"})],
         _summary_schema),
    Tool("mem", "Where the memory goes and why it ran out: the peak by category, when it happens, outlier "
         "ranks, findings ranked by the bytes they would free; CUDA memory snapshots (.pickle, read without "
         "running code). The document of `torchprof mem --json`.",
         {"paths": {**_PATHS, "description": "trace files, cycle or run folders, or memory snapshot .pickle "
                                             "files, absolute or relative to the first root"},
          "cycle": _CYCLE, "reparse": _REPARSE,
          "top": {"type": "integer", "minimum": 1, "description": "findings and sites listed (default 10)"}},
         ("paths",), ("paths",),
         lambda a, _: ["mem", *a["paths"], "--json", *_options(a, {**_CYCLE_FLAGS, "top": "--top"})],
         _mem_schema),
    Tool("collectives", "Every collective of one cycle matched across ranks: the ranks by the waiting they "
         "caused, the worst arrival skew, bus bandwidth per collective type. The document of "
         "`torchprof collectives --json`.",
         {"paths": _PATHS, "cycle": _CYCLE, "reparse": _REPARSE, "align_clocks": _ALIGN,
          "top": {"type": "integer", "minimum": 1,
                  "description": "worst-skew instances listed (default 20)"}},
         ("paths",), ("paths",),
         lambda a, _: ["collectives", *a["paths"], "--json", *_options(a, {
             **_CYCLE_FLAGS, **_CLOCK_FLAGS, "top": "--top"})],
         _collectives_schema),
    Tool("hang", "Where each rank is (stacks) and which ranks did not join which collective (the "
         "flight recorder's dumps). The document of `torchprof hang --json`.",
         {"path": {"type": "string",
                   "description": "the run's --torch-profile-dir, or its flight_recorder/"}},
         ("path",), ("path",),
         lambda a, _: ["hang", a["path"], "--json"],
         _object("`torchprof hang --json` (docs/guides/hang-forensics.md)",
                 {"where": "each rank's place, ranks grouped by their innermost frames"})),
    Tool("trend", "Runs (or cycles) compared over time: step time, timers, MFU, diagnose findings, with a "
         "noise-aware change test. The document of `torchprof trend --json`.",
         {"runs": {**_PATHS, "description": "runs (--metrics-dir and/or --torch-profile-dir) or cycle "
                                           "folders, oldest first; the last is compared with the others"},
          "baseline": {**_PATHS, "description": "the baseline runs (default: every run but the last)"},
          "series": {"type": "array", "items": {"type": "string"},
                     "description": "only the series whose name matches one of these regular expressions"},
          "min_change": {"type": "number", "minimum": 0, "description": "smallest change reported, % (0.5)"}},
         ("runs",), ("runs", "baseline"),
         lambda a, _: ["trend", *a["runs"], "--json", *_options(a, {"series": "--series",
                                                                    "min_change": "--min-change"}),
                       *(["--baseline", *a["baseline"]] if a.get("baseline") else [])],
         _object("`torchprof trend --json` (docs/guides/operations.md)",
                 {"series": "each series compared: baseline, runs, changes"})),
    Tool("diff", "Two traces, cycles or runs compared: step time, GPU idle/compute/overlap, kernels and "
         "operators added, removed or changed, findings appeared or gone, the critical path's changes. The "
         "document of `torchprof diff --json`.",
         {"base": {**_PATH, "description": "the reference: " + str(_PATH["description"])},
          "new": {**_PATH, "description": "compared with base"}},
         ("base", "new"), ("base", "new"),
         lambda a, _: ["diff", a["base"], a["new"], "--json"],
         _object("`torchprof diff --json` (docs/guides/trace-toolkit.md)",
                 {"findings": "findings appeared, disappeared or changed",
                  "critical_path": "the critical path's changes"})),
    Tool("report", "A self-contained HTML report (inline SVG) of many ranks' traces, per cycle, written "
         "into the server's cache folder (never under the roots); returns where.",
         {"paths": _PATHS, "reparse": _REPARSE},
         ("paths",), ("paths",),
         lambda a, cache: ["report", *a["paths"], "-o", f"{cache}/report-{_digest(a['paths'])}.html",
                           *_options(a, {"reparse": "--reparse"})],
         _object("what was written", {"output": "the HTML file", "bytes": "its size",
                                      "traces": "traces reported", "cycles": "cycles reported"})),
)


def _digest(paths: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\0".join(paths).encode()).hexdigest()[:16]
