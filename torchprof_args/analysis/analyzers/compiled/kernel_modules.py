"""The kernels inductor generated, each given the module it came from, from the compiled-modules
file written beside the traces (``--torch-profile-compiled-modules``; the format:
:mod:`torchprof_args.shared.kernel_modules`).

On CPU each generated C++ kernel records itself in the trace (inductor's ``cpp.enable_kernel_profile``)
as ``graph_<graph id>_<kernel>``, inside its graph's ``## Call CompiledFxGraph <key> ##``.  A kernel's
name is unique in its graph's code, not across graphs (two graphs both have a ``cpp_fused_relu_0``),
and one kernel can be called more than once in a graph (block 0's ReLU and block 1's share the
code): so the file lists, per graph (its id and phase), the kernel calls in the order the graph
makes them, and each call of a graph in the trace is matched as a whole: its kernel events in time
order against the graph of the same id whose call sequence has the same names: its C++ kernels with
the operators inductor calls out to (``extern_kernels.mm``, an ``aten::mm`` event), else its C++
kernels alone.  A call that matches no graph, or several with different modules, keeps its region's
attribution.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.nesting import enclosing
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.beside import find_beside
from torchprof_args.analysis.trace import Trace
from torchprof_args.naming import COMPILED_MODULES_SUBDIR, strip_trace_suffixes
from torchprof_args.shared.kernel_modules import KernelModules, read_kernel_modules

__all__ = ["ROOT", "CompiledModule", "KernelModuleMatch", "compiled_modules", "kernel_module_match",
           "kernel_modules_file", "kernel_name"]

_KERNEL = re.compile(r"^graph_(\d+)_(cpp_\w+)$")
#: the provenance name of an operator inductor calls out to (``extern_kernels.addmm``: ``aten::addmm``).
_EXTERN = "extern_kernels."
_GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph \w+ ##$")
#: the compiled module itself (a kernel of nodes of several top-level modules, or of none).
ROOT = "(compiled module)"


def kernel_name(event_name: str) -> str:
    """A generated kernel's event name without its graph's prefix: ``graph_0_cpp_fused_relu_2`` ->
    ``cpp_fused_relu_2``."""
    return _KERNEL.sub(r"\2", event_name)


class CompiledModule(msgspec.Struct, frozen=True, gc=False):
    """The time of one module's kernels in compiled code (``Summary.compiled.modules``): the C++
    kernels inductor generated and the operators it called out to (``aten::mm``).

    Attributes:
        module: its qualified name in the compiled module (``layers.1.mlp``; ``(compiled module)``:
            the compiled module itself, for a kernel fusing nodes of several of its children).
        calls: its kernel calls in the steps; ``ms_per_step``: their time per step.
        kernels: its kernels, the most time first (at most 5).
    """

    module: str
    calls: int
    ms_per_step: float
    kernels: list[str]


@dataclass(frozen=True)
class KernelModuleMatch:
    """The trace's kernel events matched to the file: ``idx`` (event indices), each one's ``module``
    and ``graph_call`` (its ``## Call CompiledFxGraph`` event); ``source``: the file read, or why
    none was (one line), None: none beside the trace."""

    idx: np.ndarray
    module: list[str]
    source: str | None
    graph_call: np.ndarray


def kernel_modules_file(trace_path: Path, within: Sequence[str] | None = None) -> Path | None:
    """The compiled-modules file of the process that wrote ``trace_path``
    (``compiled_modules/<trace stem>.json`` in the trace's folder or up to two above), None without."""
    name = f"{strip_trace_suffixes(trace_path.name)}.json"

    def found(folder: Path) -> Path | None:
        path = folder / COMPILED_MODULES_SUBDIR / name
        return path if path.is_file() else None

    return find_beside([trace_path], within, found)


def _read(trace: Trace) -> tuple[KernelModules | None, str | None]:
    path = kernel_modules_file(trace.path)
    if path is None:
        return None, None
    try:
        return read_kernel_modules(path), str(path)
    except OSError as err:
        return None, f"{path}: not read ({err.strerror or err})"
    except ValueError as err:
        return None, str(err)


def _matched(trace: Trace, group: list[int],
             sequences: dict[tuple[int, tuple[str, ...]], set[tuple[str | None, ...]]]
             ) -> list[tuple[int, str | None]]:
    """One graph call's kernel events (time order) with their modules: all of them where a graph
    of their id makes the same calls, generated and called-out kernels alike; else its generated
    kernels alone where a graph's generated kernels are these; else none."""
    names = [trace.names[trace.name_id[i]] for i in group]
    parsed = [_KERNEL.match(n) for n in names]
    ids = {int(p.group(1)) for p in parsed if p}
    if len(ids) != 1:
        return []
    graph_id = ids.pop()
    whole = tuple(p.group(2) if p else _EXTERN + n.removeprefix("aten::")
                  for p, n in zip(parsed, names, strict=True))
    generated = [(i, p.group(2)) for i, p in zip(group, parsed, strict=True) if p]
    for events, calls in ((group, whole), ([i for i, _ in generated], tuple(k for _, k in generated))):
        found = sequences.get((graph_id, calls))
        if found is not None and len(found) == 1:  # several: graphs with other modules, none told
            (mods,) = found
            return list(zip(events, mods, strict=True))
    return []


def kernel_module_match(trace: Trace) -> KernelModuleMatch:
    """The trace's generated-kernel events with the module each came from (see the module docstring)."""
    memo = trace.memo.kernel_modules
    if memo is not None:
        return memo
    empty = np.zeros(0, dtype=np.int64)
    names = trace.names
    is_kernel = lookup(names, lambda n: _KERNEL.match(n) is not None)
    kernels = np.flatnonzero(is_kernel[trace.name_id])
    doc, source = _read(trace) if len(kernels) else (None, None)
    if doc is None:
        match = KernelModuleMatch(empty, [], source, empty)
        trace.memo.kernel_modules = match
        return match
    sequences: dict[tuple[int, tuple[str, ...]], set[tuple[str | None, ...]]] = {}
    extern: set[str] = set()
    for graph in doc.graphs:
        for made in (graph.kernels, [k for k in graph.kernels if not k.name.startswith(_EXTERN)]):
            key = (graph.graph_id, tuple(k.name for k in made))
            sequences.setdefault(key, set()).add(tuple(k.module for k in made))
        extern.update(f"aten::{k.name[len(_EXTERN):]}" for k in graph.kernels if k.name.startswith(_EXTERN))
    called = np.flatnonzero(lookup(names, lambda n: n in extern)[trace.name_id])
    graph_calls = np.flatnonzero(lookup(names, lambda n: _GRAPH_CALL.match(n) is not None)[trace.name_id])
    events = np.concatenate([kernels, called])
    around = enclosing(trace, events, graph_calls)
    idx: list[int] = []
    modules: list[str] = []
    calls: list[int] = []
    inside = events[around >= 0]
    owner = around[around >= 0]
    order = np.lexsort((trace.ts[inside], owner))
    inside, owner = inside[order], owner[order]
    bounds = np.flatnonzero(np.diff(owner)) + 1
    firsts = owner[np.r_[0, bounds]].tolist() if len(inside) else []
    for group, call in zip(np.split(inside, bounds) if len(inside) else [], firsts, strict=True):
        for i, module in _matched(trace, group.tolist(), sequences):
            if module is not None:
                idx.append(i)
                modules.append(module or ROOT)
                calls.append(call)
    match = KernelModuleMatch(np.asarray(idx, dtype=np.int64), modules, source,
                              np.asarray(calls, dtype=np.int64))
    trace.memo.kernel_modules = match
    return match


def compiled_modules(trace: Trace, start: float, end: float, n_steps: int,
                     labels: list[str] | None = None) -> list[CompiledModule]:
    """Compiled code's kernels' time in the steps (``start``..``end``, ``n_steps`` of them) by the
    module each came from (or by ``labels``, one per matched event), the most time first (empty
    without the file or a match)."""
    match = kernel_module_match(trace)
    if not len(match.idx):
        return []
    in_steps = (trace.ts[match.idx] >= start) & (trace.ts[match.idx] < end)
    time: dict[str, float] = {}
    calls: dict[str, int] = {}
    per_kernel: dict[str, dict[str, float]] = {}
    for i, module, keep in zip(match.idx.tolist(), labels or match.module, in_steps.tolist(), strict=True):
        if not keep:
            continue
        dur = float(trace.dur[i])
        time[module] = time.get(module, 0.0) + dur
        calls[module] = calls.get(module, 0) + 1
        name = kernel_name(trace.names[trace.name_id[i]])
        kernels = per_kernel.setdefault(module, {})
        kernels[name] = kernels.get(name, 0.0) + dur
    steps = max(n_steps, 1)
    rows = [CompiledModule(module=m, calls=calls[m], ms_per_step=t / 1e3 / steps,
                           kernels=sorted(per_kernel[m], key=lambda k: -per_kernel[m][k])[:5])
            for m, t in time.items()]
    return sorted(rows, key=lambda r: -r.ms_per_step)
