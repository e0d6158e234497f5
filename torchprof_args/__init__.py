"""torchprof-args: production profiling for large-model training from the command line.

``import torchprof_args`` is light: it does not import torch, wandb, deepspeed, megatron or the
trace toolkit.  Heavier parts load on first use through :func:`__getattr__`.
"""

from __future__ import annotations

# isort: off
# First: the process's state before anything of this package runs (ondemand/dynolog.py reads it).
import torchprof_args.import_state  # noqa: F401
# isort: on

import importlib
from typing import Any

from torchprof_args.capture.config import add_torch_profile_args, configs_from_args, validate_args
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.lazy import lazy_attribute

__version__ = "0.1.0"

#: public name -> module that defines it (loaded lazily).
_LAZY = {
    "TorchProfiler": "torchprof_args.capture.runtime.profiler",
    "ProfileSchedule": "torchprof_args.capture.runtime.schedule",
    "Timers": "torchprof_args.capture.metrics.timers",
    "MetricsWriter": "torchprof_args.capture.metrics.writer",
    "OnDemandController": "torchprof_args.capture.ondemand.controller",
}

__all__ = [
    "TorchProfileArgsError", "add_torch_profile_args", "cli", "configs_from_args", "validate_args", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name == "cli":  # the decorator module, callable as the decorator itself
        return importlib.import_module("torchprof_args.cli")
    return lazy_attribute(globals(), _LAZY, __name__, name)
