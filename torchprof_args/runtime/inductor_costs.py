"""Inductor's FLOP and byte estimates written into the trace: ``--torch-profile-with-flops`` on a
compiled model.

torch.profiler counts no FLOPs of a Triton kernel inductor generated (its operators are gone), but
inductor estimates them itself and writes ``kernel_flop`` and ``kernel_num_gb`` into each kernel
launch's profiler ``args`` when its ``benchmark_kernel`` setting was on as the kernel was generated
(torch/_inductor/codegen/triton.py, ``inductor_meta_common``; read back by
:mod:`torchprof_args.analysis.analyzers.compiled` and ``low_mfu``).  The setting is part of
inductor's cache key, so kernels cached without it are generated again.  It is set when profiling
starts: a graph compiled before (a warm-up outside the profiler) keeps its kernels without the
figures.  What it costs: the estimate per kernel at compile time and a benchmark harness in each
generated module (never run), nothing per launch; inductor prints each compiled module's path on
stderr.  ``profile_bandwidth``, which also writes ``kernel_num_gb``, is not used: it synchronises the
device around every kernel.
"""

from __future__ import annotations

__all__ = ["write_kernel_costs"]


def write_kernel_costs() -> bool:
    """Have inductor write its kernels' FLOPs and bytes into their launches (``benchmark_kernel``).

    Returns:
        False where this torch has no inductor.
    """
    try:
        import torch._inductor.config as inductor_config
    except ImportError:
        return False
    inductor_config.benchmark_kernel = True
    return True
