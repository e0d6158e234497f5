"""Compiled code (``torch.compile``, inductor) attributed to the modules it came from, and inductor's
own estimates of its Triton kernels read into a roofline.

A compiled model's trace names its code by dynamo's frame and inductor's cache: ``Torch-Compiled
Region: 0/1`` (frame 0, its second compilation: one graph can serve several modules) around each
call, ``## Call CompiledFxGraph <hash> ##`` around the graph's run, Python frames in inductor's
cache files (``torchinductor_root/4g/c4gd...py(362): call``).  What ran is told here by where it
ran: the innermost ``nn.Module: Block_1`` event around each call (``--torch-profile-with-modules``;
on a torch where that flag records nothing in eager mode, ``--torch-profile-with-stack``), else its
innermost user frame.  A backward graph runs in the autograd engine, outside every module: it is
named by its forward's module (``Block_1 (backward)``: ``CompiledFunctionBackward`` and its
``CompiledFunction`` share an autograd sequence number), else ``(backward)``.

Inductor writes ``kernel_flop`` and ``kernel_num_gb`` into the ``args`` of each Triton kernel's
launch when its ``benchmark_kernel`` setting is on (``--torch-profile-with-flops`` turns it on when
profiling starts); decoded into
:class:`~torchprof_args.analysis.trace.CompiledArgs`, each kernel's device time gives its achieved
TFLOP/s and TB/s, compared with the device's peaks (:mod:`torchprof_args.device_peaks`): the roofline.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable

import msgspec
import numpy as np

from torchprof_args.analysis.analyzers.callsites import call_sites
from torchprof_args.analysis.analyzers.compiled.kernel_modules import (
    CompiledModule,
    compiled_modules,
    kernel_module_match,
)
from torchprof_args.analysis.analyzers.cpu_ops import cpu_tree
from torchprof_args.analysis.analyzers.event_names import MODULE_PREFIX
from torchprof_args.analysis.analyzers.nesting import enclosing
from torchprof_args.analysis.analyzers.select import lookup
from torchprof_args.analysis.analyzers.stepwise import context
from torchprof_args.analysis.trace import Trace
from torchprof_args.device_peaks import peak_tbps, peak_tflops

__all__ = ["IN_BACKWARD", "CompiledCode", "CompiledRegion", "KernelRoofline", "compiled_code",
           "kernel_launchers", "kernel_roofline", "modules_around"]

_REGION = re.compile(r"^Torch-Compiled Region: \d+/\d+$")
_GRAPH = re.compile(r"^## Call CompiledFxGraph (\w+) ##$")
#: the autograd engine's event around each backward node it runs (``CompiledFunctionBackward``'s too).
_ENGINE = "autograd::engine::evaluate_function: "
#: a compiled function's forward and backward (autograd nodes with a sequence number each).
_FORWARD, _BACKWARD_FUNCTION = "CompiledFunction", "CompiledFunctionBackward"
#: modules (and call sites) listed per region, the most calls first.
_MODULES_KEPT = 8
#: what a call in the backward pass ran for when no forward's module is known (the suffix otherwise).
IN_BACKWARD = "(backward)"


class CompiledRegion(msgspec.Struct, frozen=True, gc=False):
    """One compiled region or graph and what it ran for.

    Attributes:
        name: ``Torch-Compiled Region: F/C`` or ``CompiledFxGraph <hash>``.
        calls: its calls in the steps.
        ms_per_step: its calls' wall time per step (ms; a graph's holds its kernels' launches).
        modules: the innermost module around its calls (``Block_1``), the most calls first; else
            the innermost user frame; ``Block_1 (backward)`` for the backward of Block_1's graph.
    """

    name: str
    calls: int
    ms_per_step: float
    modules: list[str]


class KernelRoofline(msgspec.Struct, frozen=True, gc=False):
    """One Triton kernel (by name) on the roofline, from inductor's estimates.

    Attributes:
        name: the kernel.
        calls: its launches in the steps; ``ms_per_step``: its device time per step.
        gflop: inductor's FLOPs per launch (G, the mean; None: inductor wrote none); ``gb``: GB
            read and written per launch (the mean; None: none written).
        tflops: achieved TFLOP/s (the FLOPs over the device time); ``tbps``: achieved TB/s.
        bound: ``compute`` or ``memory``: the roof its arithmetic intensity puts it under
            (None: a peak or a figure is missing).
        of_roof: the achieved rate as a share of that roof at its intensity (1: on the roofline).
        modules: the innermost modules around its launches, the most launches first.
    """

    name: str
    calls: int
    ms_per_step: float
    gflop: float | None
    gb: float | None
    tflops: float | None
    tbps: float | None
    bound: str | None
    of_roof: float | None
    modules: list[str]


class CompiledCode(msgspec.Struct, frozen=True):
    """A trace's compiled code (``Summary.compiled``; docs/guides/trace-toolkit.md shows one).

    Attributes:
        regions: the compiled regions and graphs, the most time first.
        kernels: the Triton kernels with inductor's estimates, the most device time first.
        device, peak_tflops, peak_tbps: the roofline's device and its peaks (bf16 dense, memory;
            None: not in the table).
        inductor_flop_share: the share of the GPU's kernel time in Triton kernels inductor gave a
            FLOP count (None without kernels; kernels it calls out to, cuBLAS's, are counted from
            their operators' shapes in ``low_mfu``).
        modules: compiled code's kernels' time by the module each came from, the most first
            (``--torch-profile-compiled-modules``' file beside the trace; empty without it).
        module_map: that file's path; where it could not be read, why (one line); None: none found.
    """

    regions: list[CompiledRegion]
    kernels: list[KernelRoofline]
    device: str | None
    peak_tflops: float | None
    peak_tbps: float | None
    inductor_flop_share: float | None
    modules: list[CompiledModule] = []
    module_map: str | None = None


def _module_events(trace: Trace) -> np.ndarray:
    return np.flatnonzero(lookup(trace.names, lambda n: n.startswith(MODULE_PREFIX))[trace.name_id])


def _named(trace: Trace, wanted: Callable[[str], bool]) -> np.ndarray:
    return np.flatnonzero(lookup(trace.names, wanted)[trace.name_id])


def modules_around(trace: Trace, idx: np.ndarray) -> list[str | None]:
    """Per event of ``idx``, the innermost ``nn.Module`` event of its thread around it (its name
    without the prefix: ``Block_1``); None where none is."""
    modules = _named(trace, lambda n: n.startswith(MODULE_PREFIX))
    found = enclosing(trace, np.asarray(idx, dtype=np.int64), modules)
    return [trace.names[trace.name_id[f]][len(MODULE_PREFIX):] if f >= 0 else None for f in found.tolist()]


def _forward_modules(trace: Trace) -> dict[int, str]:
    """The module around each compiled function's forward (``CompiledFunction``), by its autograd
    sequence number: what the backward with that number ran for."""
    args = trace.compiled_args
    rows = np.flatnonzero(args.seq >= 0)
    forward = rows[lookup(trace.names, (_FORWARD,))[trace.name_id[args.idx[rows]]]]
    mods = modules_around(trace, args.idx[forward])
    return {int(seq): m for seq, m in zip(args.seq[forward].tolist(), mods, strict=True) if m is not None}


def _owners(trace: Trace, idx: np.ndarray) -> list[str]:
    """What each event of ``idx`` ran for: its module; in a compiled function's backward, the module
    of its forward (``Block_1 (backward)``: the autograd sequence number ties them); else
    :data:`IN_BACKWARD` when the autograd engine runs it (no module is around a backward); else its
    user frame; else ``?``."""
    mods = modules_around(trace, idx)
    missing = np.asarray([i for i, m in enumerate(mods) if m is None], dtype=np.int64)
    if not len(missing):
        return [m or "?" for m in mods]
    args = trace.compiled_args
    seq_of = dict(zip(args.idx.tolist(), args.seq.tolist(), strict=True))
    forward = _forward_modules(trace)
    compiled_bwd = enclosing(trace, idx[missing], _named(trace, lambda n: n == _BACKWARD_FUNCTION))
    engine = enclosing(trace, idx[missing], _named(trace, lambda n: n.startswith(_ENGINE)))
    sites = call_sites(trace, idx[missing])
    for k, i in enumerate(missing.tolist()):
        of = forward.get(seq_of.get(int(compiled_bwd[k]), -1)) if compiled_bwd[k] >= 0 else None
        mods[i] = (f"{of} {IN_BACKWARD}" if of else IN_BACKWARD if engine[k] >= 0 or compiled_bwd[k] >= 0
                   else sites[k] or "?")
    return [m or "?" for m in mods]


def _regions(trace: Trace, start: float, end: float, n_steps: int) -> list[CompiledRegion]:
    names = trace.names
    label: dict[int, str] = {}
    for i, n in enumerate(names):
        if _REGION.match(n):
            label[i] = n
        elif graph := _GRAPH.match(n):
            label[i] = f"CompiledFxGraph {graph.group(1)}"
    if not label:
        return []
    wanted = np.zeros(len(names) + 1, dtype=bool)
    wanted[list(label)] = True
    idx = np.flatnonzero(wanted[trace.name_id] & (trace.ts >= start) & (trace.ts < end))
    owners = _owners(trace, idx)
    calls: dict[str, Counter[str]] = defaultdict(Counter)
    wall: dict[str, float] = defaultdict(float)
    for i, owner in zip(idx.tolist(), owners, strict=True):
        key = label[int(trace.name_id[i])]
        calls[key][owner] += 1
        wall[key] += float(trace.dur[i])
    rows = [CompiledRegion(name, calls=sum(c.values()), ms_per_step=wall[name] / 1e3 / n_steps,
                           modules=[m for m, _ in c.most_common(_MODULES_KEPT)]) for name, c in calls.items()]
    return sorted(rows, key=lambda r: -r.ms_per_step)


def _shared_labels(trace: Trace) -> list[str] | None:
    """Per matched kernel event, its module, named with what its graph's call ran for
    (``up in Block_2``) where that graph ran for several (one graph serving blocks 1-3: the module
    path inside the graph is the same in each); None where no graph did."""
    match = kernel_module_match(trace)
    if not len(match.idx):
        return None
    calls = np.unique(match.graph_call)
    owner = dict(zip(calls.tolist(), _owners(trace, calls), strict=True))
    runs_for: dict[int, set[str]] = defaultdict(set)  # graph (its name id) -> what its calls ran for
    for call in calls.tolist():
        runs_for[int(trace.name_id[call])].add(owner[call].removesuffix(f" {IN_BACKWARD}"))
    if all(len(ran) < 2 for ran in runs_for.values()):
        return None
    return [f"{module} in {owner[call]}" if len(runs_for[int(trace.name_id[call])]) > 1 else module
            for module, call in zip(match.module, match.graph_call.tolist(), strict=True)]


def kernel_launchers(trace: Trace, launches: np.ndarray) -> np.ndarray:
    """Per runtime launch of ``launches`` (event indices, ``NO_LAUNCH`` for none), the row of
    ``trace.compiled_args`` whose event encloses it (inductor's launch of a Triton kernel: its
    parent, or an ancestor a few levels up); -1 where none does."""
    costs = trace.compiled_args
    out = np.full(len(launches), -1, dtype=np.int64)
    if not len(costs) or not len(launches):
        return out
    tree = cpu_tree(trace)
    position = np.full(len(trace.ts) + 1, -1, dtype=np.int64)
    position[tree["idx"]] = np.arange(len(tree["idx"]), dtype=np.int64)
    row_at = np.full(len(tree["idx"]) + 1, -1, dtype=np.int64)  # tree position -> costs row
    launch_rows = np.flatnonzero((costs.flop >= 0) | (costs.gb >= 0))  # not a compiled function's
    found = position[costs.idx[launch_rows]]
    row_at[found[found >= 0]] = launch_rows[found >= 0]
    parent = np.r_[tree["parent"].astype(np.int64), -1]
    at = position[np.where(launches >= 0, launches, len(trace.ts))]
    todo = np.flatnonzero(at >= 0)
    for _ in range(8):  # the launch's op is its parent; a wrapper or two at most between them
        at[todo] = parent[at[todo]]
        todo = todo[at[todo] >= 0]
        hit = row_at[at[todo]] >= 0
        out[todo[hit]] = row_at[at[todo[hit]]]
        todo = todo[~hit]
        if not len(todo):
            break
    return out


def _roofline(flop: float, gb: float, dur_us: float, peak_t: float | None,
              peak_b: float | None) -> tuple[float | None, float | None, str | None, float | None]:
    """Achieved TFLOP/s and TB/s of ``flop`` FLOPs and ``gb`` GB in ``dur_us``; the roof it is under
    and the share of it achieved."""
    seconds = dur_us / 1e6
    tflops = flop / seconds / 1e12 if seconds > 0 and flop >= 0 else None
    tbps = gb / seconds / 1e3 if seconds > 0 and gb >= 0 else None
    if tflops is None or tbps is None or not peak_t or not peak_b or gb <= 0:
        return tflops, tbps, None, None
    intensity = flop / (gb * 1e9)  # FLOP per byte
    ridge = peak_t * 1e12 / (peak_b * 1e12)
    if intensity >= ridge:
        return tflops, tbps, "compute", tflops / peak_t
    return tflops, tbps, "memory", tbps / peak_b


def kernel_roofline(trace: Trace, device: str | None) -> tuple[list[KernelRoofline], float | None]:
    """The Triton kernels with inductor's estimates on the roofline of ``device`` (its table peaks),
    the most device time first, and the share of the kernel time they cover with a FLOP count (None
    without kernels)."""
    return _kernels(trace, peak_tflops(device) if device else None, peak_tbps(device) if device else None)


def _kernels(trace: Trace, peak_t: float | None,
             peak_b: float | None) -> tuple[list[KernelRoofline], float | None]:
    ctx = context(trace)
    if not ctx.has_gpu:
        return [], None
    rows = kernel_launchers(trace, ctx.launch)
    is_kernel = lookup(trace.cats, ("kernel", "Kernel"))[trace.cat_id[ctx.kernels]]
    rows[~is_kernel] = -1  # a memset or copy under a launch is no Triton kernel's
    busy = ctx.k_end - ctx.k_ts
    total = float(busy.sum())
    costs = trace.compiled_args
    with_flop = rows >= 0
    with_flop[with_flop] = costs.flop[rows[with_flop]] >= 0
    known = float(busy[with_flop].sum()) / total if total > 0 else None
    has = np.flatnonzero(rows >= 0)
    if not len(has):
        return [], known
    owners = _owners(trace, costs.idx[rows[has]])
    by_name: dict[int, list[int]] = defaultdict(list)
    for k in has.tolist():
        by_name[int(trace.name_id[ctx.kernels[k]])].append(k)
    owner_of = dict(zip(has.tolist(), owners, strict=True))
    out = []
    for name_id, ks in by_name.items():
        sel = np.asarray(ks)
        flop, gb = costs.flop[rows[sel]], costs.gb[rows[sel]]
        dur = float(busy[sel].sum())
        f = float(flop.sum()) if (flop >= 0).all() else -1.0
        g = float(gb.sum()) if (gb >= 0).all() else -1.0
        tflops, tbps, bound, of_roof = _roofline(f, g, dur, peak_t, peak_b)
        mods = Counter(owner_of[k] for k in ks)
        out.append(KernelRoofline(
            name=trace.names[name_id], calls=len(ks), ms_per_step=ctx.ms(dur),
            gflop=f / len(ks) / 1e9 if f >= 0 else None, gb=g / len(ks) if g >= 0 else None,
            tflops=tflops, tbps=tbps, bound=bound, of_roof=of_roof,
            modules=[m for m, _ in mods.most_common(_MODULES_KEPT)]))
    return sorted(out, key=lambda r: -r.ms_per_step), known


def compiled_code(trace: Trace, device: str | None, top: int | None = 30) -> CompiledCode | None:
    """The trace's compiled regions and Triton kernels (None: nothing compiled in it).

    Args:
        trace: a loaded trace.
        device: its GPU's name (``deviceProperties``), for the roofline's peaks; None without one.
        top: kernels kept (the most device time first); None keeps them all.
    """
    if not len(trace.compiled_args) and not any(_REGION.match(n) or _GRAPH.match(n) for n in trace.names):
        return None  # an eager trace: no step context built for nothing
    ctx = context(trace)
    peak_t = peak_tflops(device) if device else None
    peak_b = peak_tbps(device) if device else None
    regions = _regions(trace, ctx.start, ctx.end, ctx.n_steps)
    kernels, known = _kernels(trace, peak_t, peak_b)
    if not regions and not kernels:
        return None
    modules = compiled_modules(trace, ctx.start, ctx.end, ctx.n_steps, _shared_labels(trace))
    return CompiledCode(regions=regions, kernels=kernels if top is None else kernels[:top], device=device,
                        peak_tflops=peak_t, peak_tbps=peak_b, inductor_flop_share=known,
                        modules=modules if top is None else modules[:top],
                        module_map=kernel_module_match(trace).source)
