"""What :meth:`TorchProfiler.start <torchprof_args.capture.runtime.profiler.TorchProfiler.start>` builds on
each rank, and the start-up agreement.  Collective: every rank calls :func:`set_up_rank` together.

It resolves the traced ranks (``--torch-profile-parallel-ranks`` needs every rank), opens the
fence's gloo group, builds the memory snapshotter, nsys, the on-demand controller and this rank's
private staging, and gives the :class:`~torchprof_args.capture.runtime.timeline.Timeline` what its
plans need.  Then every rank agrees: all raise together when any rank cannot stage, and all fence at
the memory-snapshot interval of any rank that dumps snapshots.  Only then is the rank's writer built
(its publisher starts with it).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

from torchprof_args.capture.ondemand.controller import OnDemandController
from torchprof_args.capture.runtime.companions.execution_trace import ExecutionTrace
from torchprof_args.capture.runtime.config import ProfilerConfig
from torchprof_args.capture.runtime.export.staging import StagingArea
from torchprof_args.capture.runtime.export.writer import TraceWriter
from torchprof_args.capture.runtime.fence import Fence
from torchprof_args.capture.runtime.inductor.kernel_modules import enable_kernel_modules
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter
from torchprof_args.capture.runtime.nsys import NsysController
from torchprof_args.capture.runtime.ranks import traced_ranks
from torchprof_args.capture.runtime.timeline import Timeline
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.log import get_logger

logger = get_logger(__name__)

__all__ = ["RankSetup", "set_up_rank"]


@dataclasses.dataclass
class RankSetup:
    """The components this rank runs with (None: not used on this rank)."""

    traced_ranks: tuple[int, ...] | None
    memory: MemorySnapshotter | None = None
    nsys: NsysController | None = None
    on_demand: OnDemandController | None = None
    writer: TraceWriter | None = None
    execution_trace: ExecutionTrace | None = None


def set_up_rank(config: ProfilerConfig, timeline: Timeline, fence: Fence, *, world_size: int,
                memory: MemorySnapshotter | None = None, nsys: NsysController | None = None) -> RankSetup:
    """Build this rank's components and agree with every rank (see the module docstring).

    ``memory`` and ``nsys`` replace the components built here.  Sets ``timeline.record``,
    ``every_step``, ``next_check`` and ``snapshot_interval``.  Raises
    :class:`~torchprof_args.TorchProfileArgsError` on every rank when any rank cannot stage.
    """
    rank, trace = timeline.rank, config.trace
    setup = RankSetup(traced_ranks(trace) if timeline.scheduled else trace.ranks)
    selected = setup.traced_ranks is None or rank in setup.traced_ranks
    timeline.record = trace.enabled and selected
    if timeline.record and trace.with_flops:
        _write_kernel_costs()
    if timeline.record and trace.compiled_modules:
        enable_kernel_modules()
    fence.open(world_size)
    if memory is None and config.memory.enabled and selected:
        memory = MemorySnapshotter(config.memory, rank=rank)
    setup.memory = memory if memory is not None and memory.usable() else None
    nsys = nsys or NsysController(enabled=config.nsys.enabled)
    setup.nsys = nsys if nsys.enabled else None
    timeline.every_step = setup.nsys is not None  # an NVTX range for every step
    if config.on_demand.enabled:
        setup.on_demand = OnDemandController(config.on_demand, rank=rank, world_size=world_size)
        setup.on_demand.setup(fence.group)  # collective; raises on every rank if unsafe
        timeline.next_check = setup.on_demand.start_checks(timeline.first_iteration - 1)
    staging, problem = None, None
    if timeline.record or setup.on_demand is not None:
        staging, problem = _open_staging(setup, config, rank)
    try:
        timeline.snapshot_interval = _agree(fence, problem, setup.memory)
    except BaseException:
        if staging is not None:
            staging.close()
        raise
    if staging is not None:  # agreed: only now the writer and its publisher (nothing to stop on a refusal)
        setup.writer = TraceWriter(config.trace.output_dir, staging, config.export, rank=rank)
    if rank == 0 and trace.modules_via_stack:
        logger.info("rank 0: --torch-profile-with-modules: torch %s records the module hierarchy only "
                    "through with_stack (with_modules does nothing in eager mode), so with_stack is on "
                    "on every traced rank", torch.__version__)
    return setup


def _write_kernel_costs() -> None:
    """Have inductor write its Triton kernels' FLOPs and bytes into their launches in the trace
    (``--torch-profile-with-flops`` on a compiled model).

    torch.profiler counts no FLOPs of a kernel inductor generated (its operators are gone), but
    inductor estimates them itself and writes ``kernel_flop`` and ``kernel_num_gb`` into each kernel
    launch's ``args`` when its ``benchmark_kernel`` setting was on as the kernel was generated
    (torch/_inductor/codegen/triton.py; read back by :mod:`torchprof_args.analysis.analyzers.compiled.regions`
    and ``low_mfu``).  The setting is part of inductor's cache key, so kernels cached without it are
    generated again; a graph compiled before profiling starts keeps its kernels without the figures.
    Its cost: the estimate per kernel at compile time and a benchmark harness in each generated
    module (never run), nothing per launch; inductor prints each compiled module's path on stderr.
    ``profile_bandwidth``, which writes ``kernel_num_gb`` too, is not used: it synchronises the
    device around every kernel.  Inductor is not imported for this (about a second, for a job that
    may never compile): where it is not loaded yet, its environment variable sets the default it
    reads when it is.
    """
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.benchmark_kernel = True  # type: ignore[attr-defined]
    else:
        os.environ["TORCHINDUCTOR_BENCHMARK_KERNEL"] = "1"


def _open_staging(setup: RankSetup, config: ProfilerConfig,
                  rank: int) -> tuple[StagingArea | None, str | None]:
    """This rank's private staging (and execution-trace file): (the staging, None), or (None, the
    problem) when staging is unsafe here (every rank raises together in :func:`_agree`).  The writer
    is built once every rank agreed: its publisher starts with it, and a refused start that had to
    stop one lasted long enough on this rank for torchrun to SIGTERM it (another rank had exited with
    the same error), its staging lock left behind."""
    staging = StagingArea(config.export.staging_dir, rank=rank)
    try:
        staging.open()
        if config.trace.execution_trace:  # on disk: an execution trace can be as large as the trace
            setup.execution_trace = ExecutionTrace((staging.disk_dirs or staging.dirs)[0], rank=rank)
    except TorchProfileArgsError as err:
        staging.close()
        return None, str(err)
    return staging, None


def _agree(fence: Fence, problem: str | None, memory: MemorySnapshotter | None) -> int:
    """Collective: raise on every rank if any rank cannot stage; returns the snapshot interval
    every rank fences at."""
    interval = memory.interval if memory is not None else 0
    answers = fence.agree((problem, interval))
    problems = [f"rank {rank}: {problem}" for rank, (problem, _) in enumerate(answers) if problem]
    if problems:
        raise TorchProfileArgsError(" ".join(problems))
    return max(every for _, every in answers)
