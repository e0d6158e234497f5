"""``--torch-profile-compiled-modules``: which module each kernel inductor generates came from,
written beside the traces (:mod:`torchprof_args.shared.kernel_modules`, read by the summary's compiled
code, the critical path's and diagnose's call sites).

The FX nodes a kernel computes and their ``nn_module_stack`` exist only while inductor compiles.
Two of inductor's own settings and one documented hook give them:

- ``trace.provenance_tracking_level = 1`` (``INDUCTOR_PROVENANCE``): inductor notes, for each kernel
  call it generates, the post-grad FX nodes it computes (``torch._inductor.debug``'s kernel -> nodes
  table, ``cpp_fused_relu_0:2`` -> ``[relu]``, in the order the graph calls them; tlparse's provenance
  view reads the same table from the structured trace, which has no hook in the job: the pass reads
  the module's global, ``_inductor_triton_kernel_to_post_grad_node_info``, a private name; where a
  torch renames it each graph logs one warning and the map has none).  It is part of inductor's
  cache key;
- ``post_grad_custom_post_pass`` (:class:`torch._inductor.custom_graph_pass.CustomGraphPass`): a pass
  that changes nothing and reads each post-grad graph's nodes' ``nn_module_stack`` (a backward node's
  ``fwd_nn_module_stack``), AOT autograd's graph id and phase (``TracingContext.aot_graph_name``,
  ``3_forward``), and where inductor's table stands before the graph's kernels are generated;
  chained after a pass the job set, never replacing it; its ``uuid`` enters the cache key;
- ``cpp.enable_kernel_profile`` (``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE``): on CPU each generated
  C++ kernel records itself in the trace, ``graph_<graph id>_cpp_fused_relu_0`` (a GPU's Triton
  kernels are in the map too, but the analysis matches only CPU traces' C++ kernels so far).

The map is complete for graphs compiled in this process after the flag took effect: a graph
inductor loads from its cache runs no pass (its kernels keep their region's modules).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any

from torchprof_args.atomic import write_bytes_atomically
from torchprof_args.log import get_logger
from torchprof_args.naming import COMPILED_MODULES_SUBDIR, trace_stem
from torchprof_args.shared.kernel_modules import CompiledGraph, GraphKernel, encode_kernel_modules

logger = get_logger(__name__)

__all__ = ["compiled_graphs", "enable_kernel_modules", "module_path", "write_kernel_modules"]

_AOT_NAME = re.compile(r"^(\d+)_(forward|backward|inference)$")
_ROOT = re.compile(r"^(?:L\[['\"][^'\"]+['\"]\]|self)")
_INDEX = re.compile(r"\[(\d+)\]")
_KEY = re.compile(r"(?:\._modules)?\[['\"]([^'\"]+)['\"]\]")


@dataclasses.dataclass
class _Seen:
    """One post-grad graph the pass saw: its id and phase, its nodes' modules, inductor's kernel ->
    nodes table (filled as its kernels are generated) and the table's length before them."""

    graph_id: int
    phase: str
    modules: dict[str, str | None]
    table: dict[str, list[str]]
    start: int


_SEEN: list[_Seen] = []


def module_path(source: str) -> str:
    """A ``nn_module_stack`` entry's path as a module's qualified name: ``L['self'].layers[2].attn``
    -> ``layers.2.attn``; ``""``: the compiled module itself."""
    path = _ROOT.sub("", source)
    path = _KEY.sub(r".\1", _INDEX.sub(r".\1", path))
    return path.lstrip(".")


def _innermost(meta: dict[str, Any]) -> str | None:
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    *_, (source, _kind) = stack.values()
    return module_path(str(source))


def _common(paths: list[str]) -> str | None:
    """The innermost module around all of ``paths`` (None without one)."""
    if not paths:
        return None
    parts = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for names in zip(*parts, strict=False):
        if len(set(names)) != 1:
            break
        common.append(names[0])
    return ".".join(common)


def _record(graph: Any) -> None:
    """The pass's work: note the graph (see the module docstring); changes nothing."""
    import torch._guards
    import torch._inductor.debug as debug

    context = torch._guards.TracingContext.try_get()
    names = getattr(context, "aot_graph_name", None) or []
    found = _AOT_NAME.match(names[0]) if names else None
    if found is None:
        return
    # a node of no other node (a constant: ``full_default``, one for the whole graph after CSE) is
    # no module's work: a kernel that reads it keeps the module of its other nodes
    modules = {node.name: _innermost(node.meta) if node.all_input_nodes else None
               for node in graph.nodes if node.op == "call_function"}
    table = debug._inductor_triton_kernel_to_post_grad_node_info
    _SEEN.append(_Seen(int(found.group(1)), found.group(2), modules, table, len(table)))


def _pass() -> Any:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class KernelModulesPass(CustomGraphPass):
        """Reads the post-grad graph's module stacks; changes nothing."""

        def __call__(self, graph: Any) -> None:
            try:
                _record(graph)
            except Exception as err:  # noqa: BLE001 (never in the way of a compile)
                logger.warning("--torch-profile-compiled-modules: a graph's modules not read (%s)", err)

        def uuid(self) -> str:
            return "torchprof-args-kernel-modules-1"

    return KernelModulesPass()


def enable_kernel_modules() -> None:
    """Turn on inductor's provenance tracking and kernel profiling and add the pass (see the module
    docstring).  Imports ``torch._inductor.config`` (the pass is set there; no environment variable
    sets one)."""
    os.environ["INDUCTOR_PROVENANCE"] = "1"
    os.environ["TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"] = "1"
    import torch._inductor.config as config

    config.trace.provenance_tracking_level = 1
    config.cpp.enable_kernel_profile = True
    current = config.post_grad_custom_post_pass
    passes = list(current) if isinstance(current, (list, tuple)) else [current] if current else []
    if not any(type(p).__name__ == "KernelModulesPass" for p in passes):
        config.post_grad_custom_post_pass = [*passes, _pass()]


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs compiled in this process since :func:`enable_kernel_modules`, each with its kernel
    calls in order (a graph's calls are the table's entries between its own start and the next
    graph's on the same table)."""
    out = []
    for k, seen in enumerate(_SEEN):
        ends = [later.start for later in _SEEN[k + 1:] if later.table is seen.table]
        entries = list(seen.table.items())[seen.start:ends[0] if ends else None]
        kernels = []
        for key, nodes in entries:
            name = key.rpartition(":")[0] or key
            known = [m for m in (seen.modules.get(n) for n in nodes) if m is not None]
            kernels.append(GraphKernel(name=name, nodes=list(nodes), module=_common(known)))
        out.append(CompiledGraph(graph_id=seen.graph_id, phase=seen.phase, kernels=kernels))
    return out


def write_kernel_modules(output_dir: str | os.PathLike[str], rank: int) -> Path | None:
    """``<output_dir>/compiled_modules/<this process's trace stem>.json`` with every graph compiled so
    far (rewritten at each flush: graphs compiled later are added); None without one."""
    if "torch._inductor.config" not in sys.modules:
        return None
    graphs = compiled_graphs()
    if not graphs:
        return None
    path = Path(output_dir) / COMPILED_MODULES_SUBDIR / f"{trace_stem(rank)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(path, encode_kernel_modules(graphs))
    return path
