"""The compiled-modules file: which module each kernel inductor generated came from (the
``kernel_modules`` :class:`~torchprof_args.shared.formats.FileFormat`).

Written in the job (``--torch-profile-compiled-modules``, capture/runtime/inductor/kernel_modules.py) beside
the traces as ``<profile dir>/compiled_modules/<trace stem>.json``, one per process, and read by
analysis/analyzers/compiled/regions.py.  Per graph inductor compiled in the process (its
graph id, the ``graph_<id>_`` of its C++ kernels' names in the trace, and forward or backward), the
kernels in the order the graph calls them: each one's name, the FX nodes it computes (inductor's
provenance tracking) and the innermost module around all of them (their ``nn_module_stack``).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from torchprof_args.shared.formats import KERNEL_MODULES

__all__ = ["KERNEL_MODULES_FORMAT", "KERNEL_MODULES_VERSION", "CompiledGraph", "GraphKernel",
           "KernelModules", "decode_kernel_modules", "encode_kernel_modules", "read_kernel_modules"]

KERNEL_MODULES_FORMAT = KERNEL_MODULES.name
KERNEL_MODULES_VERSION = KERNEL_MODULES.version


class GraphKernel(msgspec.Struct, frozen=True):
    """One call of a kernel in its graph's code.

    Attributes:
        name: the kernel as inductor named it (``cpp_fused_relu_0``; ``extern_kernels.addmm`` for an
            operator it calls out to); one kernel can be called more than once in a graph.
        nodes: the post-grad FX nodes it computes.
        module: the innermost module around all of them (``layers.1.mlp``; ``""``: the compiled module
            itself), None where no node had a module stack.
    """

    name: str
    nodes: list[str]
    module: str | None


class CompiledGraph(msgspec.Struct, frozen=True):
    """One graph inductor compiled: ``graph_id`` (AOT autograd's id, in its C++ kernels' names),
    ``phase`` (``forward``, ``backward`` or ``inference``), its kernel calls in order."""

    graph_id: int
    phase: str
    kernels: list[GraphKernel]


class KernelModules(msgspec.Struct, frozen=True):
    """A process's compiled-modules file."""

    format: str
    version: int
    graphs: list[CompiledGraph]


_DECODER = msgspec.json.Decoder(KernelModules)


def encode_kernel_modules(graphs: list[CompiledGraph]) -> bytes:
    """The file's bytes for ``graphs``."""
    return msgspec.json.encode(KernelModules(KERNEL_MODULES_FORMAT, KERNEL_MODULES_VERSION, graphs))


def decode_kernel_modules(data: bytes, name: str) -> KernelModules:
    """The file ``name`` holding ``data``; raises ValueError in one line naming it where it is not
    one, or of another version."""
    try:
        header = msgspec.json.decode(data)
    except msgspec.DecodeError as err:
        raise ValueError(f"{name}: not a compiled-modules file ({err})") from None
    if not isinstance(header, dict) or header.get("format") != KERNEL_MODULES_FORMAT:
        raise ValueError(f"{name}: not a compiled-modules file (no format {KERNEL_MODULES_FORMAT!r})")
    if header.get("version") != KERNEL_MODULES_VERSION:
        raise ValueError(f"{name}: compiled-modules version {header.get('version')!r}, this torchprof-args "
                         f"reads version {KERNEL_MODULES_VERSION}")
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as err:
        raise ValueError(f"{name}: not a compiled-modules file ({err})") from None


def read_kernel_modules(path: Path) -> KernelModules:
    """The file at ``path`` (:func:`decode_kernel_modules`; OSError where it cannot be read)."""
    return decode_kernel_modules(path.read_bytes(), str(path))
