"""What the time on a critical path is spent on: the categories every edge of the graph is put in.

An edge of the dependency graph (:mod:`.graph`) carries time of one category; the path's time by
category is the sum over its edges.  The order is the output's.
"""

from __future__ import annotations

__all__ = ["CATEGORIES", "COMMUNICATION", "COMPUTE", "CPU_ONLY", "DATA_LOADER", "HOST_SYNC", "LAUNCH",
           "MEMCPY", "WAIT_RANK", "category_names"]

#: kernels that compute on the GPU (HTA's computation and "other" classes).
COMPUTE = 0
#: collectives: NCCL kernels, gloo's transfers; the transfer once every rank has arrived.
COMMUNICATION = 1
#: kernel launches: the launch call on the CPU, the delay until the kernel starts, the gaps between
#: back-to-back kernels.
LAUNCH = 2
#: the host blocked on the device (``cudaStreamSynchronize``, ``.item()``...) or on a collective it
#: waits for right away.
HOST_SYNC = 3
#: the data loader's fetches (``enumerate(DataLoader)#...__next__``).
DATA_LOADER = 4
#: a rank waiting in a collective for another rank to arrive (only seen where the other rank's trace
#: is missing: otherwise the path moves to that rank).
WAIT_RANK = 5
#: work on the CPU that launches nothing: operators, Python, the optimizer on a CPU job.
CPU_ONLY = 6
#: host/device copies on the GPU.
MEMCPY = 7

#: the categories' names (JSON keys), by code.
CATEGORIES: tuple[str, ...] = ("compute_kernels", "communication", "launch_overhead", "host_sync",
                               "data_loader", "waiting_for_rank", "cpu_only", "memory_copies")


def category_names() -> tuple[str, ...]:
    """Every category's name, in output order."""
    return CATEGORIES
