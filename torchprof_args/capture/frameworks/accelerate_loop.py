"""The plain-loop profiler under Hugging Face Accelerate (the implementation behind
:mod:`torchprof_args.accelerate`, whose docstring shows the loop)."""

from __future__ import annotations

import argparse
from typing import Any

from torchprof_args import _dist
from torchprof_args.capture.config import configs_from_args
from torchprof_args.capture.runtime.profiler import TorchProfiler
from torchprof_args.errors import TorchProfileArgsError

__all__ = ["accelerate_layout", "accelerate_profiler"]


def accelerate_profiler(accelerator: Any, args: argparse.Namespace, *,
                        start_iteration: int | None = None) -> TorchProfiler:
    """A :class:`~torchprof_args.TorchProfiler` for a loop under ``accelerator`` (an
    ``accelerate.Accelerator``, built first: it creates the process group and picks the ranks).

    Refuses Accelerate's own profiler (an ``Accelerator(kwargs_handlers=[ProfileKwargs(...)])``)
    with ``--torch-profile``: both would drive torch.profiler in the same process.  The traces record
    the Accelerator's layout (:func:`accelerate_layout`).  ``start_iteration``: optimizer steps
    already done (a resumed run), else ``args.iteration`` or 0.
    """
    run = configs_from_args(args, world_size=int(accelerator.num_processes))
    if run.profiler.enabled and getattr(accelerator, "profile_handler", None) is not None:
        raise TorchProfileArgsError(
            "--torch-profile cannot run together with Accelerate's profiler (Accelerator(kwargs_handlers="
            "[ProfileKwargs(...)]) and accelerator.profile()): both drive torch.profiler. Drop the "
            "ProfileKwargs handler (--torch-profile-step-start/-end choose the steps).")
    prof = TorchProfiler.from_config(run, start_iteration=start_iteration)
    prof.add_trace_metadata(**accelerate_layout(accelerator))
    return prof


def accelerate_layout(accelerator: Any) -> dict[str, Any]:
    """``{"parallel": {"dp": rank}, "trainer": {...}}``: the data-parallel coordinate of this rank
    and the Accelerator's distributed type, processes and gradient accumulation."""
    distributed = getattr(accelerator, "distributed_type", None)
    import accelerate

    return {"parallel": {"dp": _dist.rank()}, "trainer": {
        "framework": f"accelerate {accelerate.__version__}",
        "distributed_type": str(getattr(distributed, "value", distributed)),
        "world_size": int(accelerator.num_processes),
        "gradient_accumulation_steps": int(getattr(accelerator, "gradient_accumulation_steps", 1) or 1),
        "mixed_precision": str(getattr(accelerator, "mixed_precision", "no")),
    }}
