"""What kind of event a name says it is: the patterns the diagnose kinds and the critical path share.

One place for them, below both: a data loader's fetch, a blocking host synchronisation, a
device-to-host copy, a kernel launch call, a host/device copy on the GPU, the c10d operator that
issues a collective and gloo's span that runs it, a module's call.
"""

from __future__ import annotations

import re

__all__ = ["COLLECTIVE_ISSUE_RE", "COLLECTIVE_RUN_RE", "COLLECTIVE_WAIT_RE", "COPY_RE", "DTOH_RE",
           "GRAPH_LAUNCH_RE", "LAUNCH_RE", "LOADER_RE", "MODULE_PREFIX", "SYNC_RE"]

#: the name prefix of the ``python_function`` event torch records around each module call
#: (``nn.Module: Block_1``; ``--torch-profile-with-modules``).
MODULE_PREFIX = "nn.Module: "

#: the data loader's spans: torch.profiler's ``enumerate(DataLoader)#...__next__`` annotation, or the
#: Python frame of ``torch/utils/data/dataloader.py``'s ``__next__`` (``--torch-profile-with-stack``).
LOADER_RE = re.compile(r"^enumerate\(DataLoader\)#.*__next__$"
                       r"|torch/utils/data/dataloader\.py\(\d+\): __next__$")
#: CUDA / HIP calls that block the host until the device has done something.
SYNC_RE = re.compile(r"^(cuda|hip)(Stream|Device|Event|Ctx)Synchroni[sz]e$")
#: a device-to-host copy on the GPU (its runtime call blocks the host: ``.item()``, ``.cpu()``).
DTOH_RE = re.compile(r"DtoH|Device -> (Pageable|Pinned|Host)")
#: HTA's launch calls (kernels, and copies / memsets with ``include_memory_events``), + HIP's.
LAUNCH_RE = re.compile(r"^(cudaLaunchKernel|cudaLaunchKernelExC|cudaMemcpyAsync|cudaMemsetAsync|"
                       r"hipLaunchKernel|hipExtLaunchKernel|hipExtModuleLaunchKernel|hipModuleLaunchKernel|"
                       r"hipMemcpyAsync|hipMemsetAsync|hipMemcpyWithStream)$")
#: a CUDA / HIP graph's replay: one call launches every kernel captured in the graph, and each of
#: them carries the call's correlation id (so they count for the CPU region around the call).
GRAPH_LAUNCH_RE = re.compile(r"^(cuda|hip)GraphLaunch(_v\d+)?$")
#: host/device copies on the GPU.
COPY_RE = re.compile(r"^Memcpy (HtoD|DtoH)")
#: the c10d operator that issues a collective (on the thread that calls it).
COLLECTIVE_ISSUE_RE = re.compile(r"^c10d::")
#: gloo's span that runs a collective (on its worker thread).
COLLECTIVE_RUN_RE = re.compile(r"^(gloo|xccl):")
#: an operator that blocks its thread until an issued collective is done: the functional
#: collectives' wait (``torch.distributed._functional_collectives``: FSDP2, torchtitan, MoE dispatch).
COLLECTIVE_WAIT_RE = re.compile(r"^_c10d_functional(_autograd)?::wait_tensor$")
