"""torchtitan integration: its trainer under ``TorchProfiler``, with a ``[torch_profile]`` section.

    torchrun --nproc_per_node 8 -m torchprof_args.torchtitan --module llama3 --config llama3_8b \\
        --torch_profile.enable --torch_profile.step_start 10 --torch_profile.step_end 12 \\
        --torch_profile.ranks all --torch_profile.dir ./prof --torch_profile.metrics_peak_tflops 989

This is torchtitan's own ``torchtitan.train`` entry point with one more config section: every
``--torch-profile-*`` and ``--metrics-*`` flag as ``--torch_profile.<name>`` (``--torch-profile`` is
``--torch_profile.enable``).  The train loop runs under ``TorchProfiler`` (``ProfilerStep#N`` is
torchtitan's step N; resumed checkpoints continue the numbering; every flush waits at the fence);
the step timers, ``throughput`` and ``mfu`` (from torchtitan's own FLOP count per token) join its
metrics processor's logs.  torchtitan's own ``--profiler.enable_profiling`` (and
``--profiler.enable_memory_snapshot`` with ``--torch_profile.memory_snapshot``) is refused when the
flags are parsed, with one ``error:`` line, exit status 2.

For a config registry of your own, :func:`profiled_config_class` gives the ``Config`` class with
the section.  Install with the ``torchtitan`` extra (torchtitan 0.3: its ``--module``/``--config``
registry; it runs on a GPU: its trainer sets the CUDA device).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from torchprof_args.capture.frameworks.torchtitan_config import SECTION, TorchProfileSection, run_config
from torchprof_args.capture.frameworks.torchtitan_parse import parse_config, profiled_config_class
from torchprof_args.errors import TorchProfileArgsError

__all__ = ["SECTION", "TorchProfileSection", "main", "parse_config", "profiled_config_class", "run_config"]


def main(argv: Sequence[str] | None = None) -> int:
    """``torchtitan.train``'s main with the section: parse (one ``error:`` line and exit 2 on a bad
    setting), build the trainer, train, close, destroy the process group."""
    import torch
    from torchtitan.tools.logging import init_logger

    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
    except TorchProfileArgsError as err:
        print(f"torchprof_args.torchtitan: error: {err}", file=sys.stderr)
        return 2
    init_logger()  # torchtitan's: replaces the root logger's handlers (after the parse, as it prints)
    trainer = config.build()
    try:
        trainer.train()
    finally:
        trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
