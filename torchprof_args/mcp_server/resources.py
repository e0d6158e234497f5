"""``torchprof mcp``'s resources: the runs and profiled cycles under its roots.

A *run* is a folder of profiled cycles (the ``--torch-profile-dir``: one ``iter<first>-<last>/``
folder per cycle, or the flat layout's ``*_iterA-B.pt.trace.json.gz`` names); a *cycle* is one
cycle folder.  Each is a resource (``file://`` + its real path) whose content is a JSON listing:
its cycles or its traces, their sizes, which have a summary sidecar, and the arguments that point a
tool at it.  Only names and sizes are read (``os.walk`` without following links, at most
:data:`MAX_DEPTH` folders deep, hidden folders and the runs' own subfolders skipped).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchprof_args.naming import (
    SUMMARIES_SUBDIR,
    TRACE_SUFFIX,
    cycle_of_name,
    rank_from_file_name,
    sidecar_path,
)

__all__ = ["MAX_DEPTH", "MAX_RESOURCES", "Run", "find_runs", "listing"]

#: How deep below a root runs are looked for.
MAX_DEPTH = 6
#: The most resources listed (the latest runs' first).
MAX_RESOURCES = 500
#: A run's subfolders that hold no cycle.
_SKIPPED = frozenset({SUMMARIES_SUBDIR, "execution_traces", "flight_recorder", "memory_snapshots", "stacks",
                      "requests", "answers", "processed"})


@dataclass
class Run:
    """A run folder and its cycles: (first iteration, last iteration) -> that cycle's traces."""

    path: str
    cycles: dict[tuple[int, int] | None, list[str]] = field(default_factory=dict)
    folders: dict[tuple[int, int] | None, str] = field(default_factory=dict)  # the cycle folders


def _traces(folder: str, names: list[str]) -> list[str]:
    return sorted(os.path.join(folder, n) for n in names
                  if TRACE_SUFFIX in n and not n.startswith(".") and n.endswith((".json", ".json.gz")))


def find_runs(roots: tuple[str, ...]) -> list[Run]:
    """Every run under ``roots`` (real paths), most recently changed first."""
    runs: dict[str, Run] = {}
    for root in roots:
        depth0 = root.rstrip(os.sep).count(os.sep)
        for folder, subdirs, files in os.walk(root, followlinks=False):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d not in _SKIPPED
                                and not d.endswith(".split"))
            if folder.count(os.sep) - depth0 >= MAX_DEPTH:
                subdirs[:] = []
            traces = _traces(folder, files)
            if not traces:
                continue
            iterations = cycle_of_name(os.path.basename(folder), folder=True)
            if iterations is not None:
                run = runs.setdefault(os.path.dirname(folder), Run(os.path.dirname(folder)))
                run.cycles[iterations] = traces
                run.folders[iterations] = folder
                continue
            run = runs.setdefault(folder, Run(folder))
            for trace in traces:
                run.cycles.setdefault(cycle_of_name(os.path.basename(trace), folder=False), []).append(trace)
    return sorted(runs.values(), key=lambda r: -_mtime(r.path))


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _label(iterations: tuple[int, int] | None) -> str:
    return "no cycle in the names" if iterations is None else f"iterations {iterations[0]}-{iterations[1]}"


def _cycle_entry(run: Run, iterations: tuple[int, int] | None) -> dict[str, Any]:
    traces = run.cycles[iterations]
    return {"cycle": None if iterations is None else iterations[0], "iterations": _label(iterations),
            "path": run.folders.get(iterations, run.path), "traces": len(traces),
            "sidecars": sum(sidecar_path(t).is_file() for t in traces),
            "bytes": sum(_size(t) for t in traces)}


def listing(runs: list[Run], real: str) -> dict[str, Any] | None:
    """The JSON content of the resource at ``real`` (a run or a cycle folder), None when it is neither."""
    for run in runs:
        ordered = sorted(run.cycles, key=lambda k: (k is None, k or (0, 0)))
        if run.path == real:
            cycles = [_cycle_entry(run, k) for k in ordered]
            return {"kind": "run", "path": run.path, "cycles": cycles,
                    "tools": {"path": run.path, "cycle": "a cycle's first iteration (default: the latest)"}}
        for key, folder in run.folders.items():
            if folder == real:
                traces = [{"file": Path(t).name, "rank": rank_from_file_name(Path(t).name), "bytes": _size(t),
                           "sidecar": sidecar_path(t).is_file()} for t in run.cycles[key]]
                return {"kind": "cycle", "path": folder, "run": run.path, "iterations": _label(key),
                        "traces": traces, "tools": {"path": folder}}
    return None


def resources(runs: list[Run], roots: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each run and cycle folder as a resource's fields: uri, name, description."""
    out: list[dict[str, Any]] = []
    for run in runs:
        keys = sorted(run.cycles, key=lambda k: (k is None, k or (0, 0)))
        named = [k for k in keys if k is not None]
        latest = named[-1] if named else None
        out.append({"uri": Path(run.path).as_uri(), "name": _relative(run.path, roots),
                    "description": f"run: {len(keys)} profiled cycle(s), latest {_label(latest)}; "
                                   "the diagnose and critical-path tools take it as path"})
        for key in reversed(keys):
            if key in run.folders:
                n, folder = len(run.cycles[key]), run.folders[key]
                out.append({"uri": Path(folder).as_uri(), "name": _relative(folder, roots),
                            "description": f"cycle {_label(key)} of {_relative(run.path, roots)}: "
                                           f"{n} trace(s)"})
    return out[:MAX_RESOURCES]


def _relative(path: str, roots: tuple[str, ...]) -> str:
    for root in roots:
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.join(os.path.basename(root), os.path.relpath(path, root)).rstrip("/.")
    return path
