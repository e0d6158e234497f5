"""Megatron-LM and megatron-core integration: flags and a one-call loop hook.

Three ways in, from least to most code:

* ``extra_args_provider=torchprof_args.megatron.extra_args_provider`` (or
  :func:`compose_args_providers` with your own providers) adds every torchprof flag to Megatron's
  parser; options Megatron already defines (``--tensorboard-dir``, ``--log-interval``,
  ``--timing-log-level``, ``--wandb-project`` ...) are reused, not redefined.  Up to core_v0.17.x
  it goes to ``pretrain(..., extra_args_provider=...)``; from core_v0.18.0, where ``pretrain``
  takes a config container, to ``parse_and_validate_args(extra_args_provider=...)`` (see
  :func:`pretrain_takes_config_container`).  The flags are checked as soon as Megatron has parsed
  them (before it validates its own arguments or builds anything): a conflict such as
  ``--profile --use-pytorch-profiler`` with ``--torch-profile`` exits 2 with a one-line error.
* :func:`install` before ``pretrain(...)`` in ``pretrain_gpt.py`` patches Megatron-LM's
  ``megatron.training.training`` module at call time: ``train`` is wrapped to own the profiler
  for the whole loop, ``training_log`` (called once per iteration, with the global iteration
  that just finished) steps it, and ``checkpoint_and_decide_exit`` flushes a window still
  recording when Megatron decides to exit (``--exit-interval``, ``--exit-duration-in-mins``, its
  signal handler).  Megatron-LM's source is not edited; :func:`uninstall` undoes it.
* :class:`TrainingHook` is the same thing for forks whose loop differs: create it after the
  checkpoint is loaded, call ``hook.step(iteration)`` after each iteration, close it at the end.

Every flush of a trace window, scheduled or at exit, is timed with Megatron's own timers
(``torch-profile-flush``; Megatron's ``Timers.write`` names the scalar
``torch-profile-flush-time``) and written, max across ranks, through Megatron's TensorBoard and
wandb writers.  At every log interval ``install()`` also writes TFLOP/s and MFU from Megatron-LM's
own ``num_floating_point_operations``, the allocator and GPU readings, and the slowest rank and
straggler scores of Megatron's own timers (:mod:`torchprof_args.capture.frameworks.megatron_metrics`).
``--torch-profile-parallel-ranks`` selects traced ranks by megatron-core's parallel coordinates
(:mod:`torchprof_args.capture.runtime.ranks`).
"""

from torchprof_args.capture.frameworks.megatron_args import (
    check_megatron_args,
    check_parsed_args,
    compose_args_providers,
    extra_args_provider,
    profiler_from_args,
)
from torchprof_args.capture.frameworks.megatron_install import (
    install,
    installed,
    pretrain_takes_config_container,
    uninstall,
)
from torchprof_args.capture.frameworks.megatron_loop import FLUSH_TIMER, TrainingHook
from torchprof_args.errors import MegatronIntegrationError

__all__ = [
    "FLUSH_TIMER",
    "MegatronIntegrationError",
    "TrainingHook",
    "check_megatron_args",
    "check_parsed_args",
    "compose_args_providers",
    "extra_args_provider",
    "install",
    "installed",
    "pretrain_takes_config_container",
    "profiler_from_args",
    "uninstall",
]
