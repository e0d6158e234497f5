"""The summary document: one trace's :class:`Summary`, what ``torchprof summary --json`` prints and a
summary sidecar keeps under ``summary``.

A msgspec struct whose fields are in the document's key order, so it encodes to the documented JSON
as it is; its sections are the analyzers' own results (:class:`~.analyzers.gpu.GpuBreakdown`,
:class:`~.analyzers.cpu_ops.OperatorTotal`, ...).  A sidecar's is decoded with validation
(:func:`decode_summary`): one that does not fit the schema is not used (the trace is parsed).
"""

from __future__ import annotations

import msgspec

from torchprof_args.analysis.analyzers.compiled.regions import CompiledCode
from torchprof_args.analysis.analyzers.cpu_ops import CpuThreads, OperatorTotal
from torchprof_args.analysis.analyzers.fsdp import FsdpPhase, FsdpStepSplit
from torchprof_args.analysis.analyzers.gpu import GpuBreakdown, KernelTotal
from torchprof_args.analysis.analyzers.memory_events import MemoryPeak
from torchprof_args.analysis.analyzers.step_ops import StepOps

__all__ = ["StepTime", "Summary", "decode_summary"]


class StepTime(msgspec.Struct, frozen=True, gc=False):
    """One ``ProfilerStep#N`` of the trace and its duration (us)."""

    name: str
    dur_us: float


class Summary(msgspec.Struct, frozen=True):
    """One trace's summary (docs/guides/trace-toolkit.md shows one).

    Attributes:
        file: the trace it describes.
        rank: ``distributedInfo.rank`` (None when the trace does not say); ``world_size`` and
            ``backend`` likewise.
        host: the host that wrote it; ``iterations`` the first and last profiled iteration;
            ``parallel`` the rank's parallel coordinates (:class:`~.analyzers.origin.Origin`).
        base_time_ns: ``baseTimeNanoseconds``, the clock the event times are relative to.
        events: the complete events kept; ``uncompressed_bytes`` the trace's JSON size.
        steps: the ``ProfilerStep#N`` annotations in time order; ``step_mean_us`` their mean
            (None without steps).
        work_mean_us: the mean step less the rank's time in collectives, its work
            (:mod:`~torchprof_args.analysis.analyzers.step_work`: what the cross-rank view's straggler
            rule scores; None without steps).
        gpu: the GPU breakdown with HTA's definitions (None without kernels).
        cpu: each CPU thread's busy time (None without CPU operators).
        top_kernels: the kernel names with the longest total time.
        top_cpu_ops: the operators by CPU total; ``top_cpu_ops_by_self`` by self CPU time;
            ``top_ops_by_device`` by device time (empty without kernels).
        memory: the ``[memory]`` events' peaks per device (empty without them).
        ops_in_steps: what ran inside the steps, per name (what ``torchprof diff`` compares).
        fsdp: FSDP2's phases per step, in a step's order (empty: the model is not ``fully_shard``-ed).
        fsdp_step: the mean step by FSDP2 phase, additive (None: not ``fully_shard``-ed).
        compiled: the compiled regions and graphs with the modules they ran for, and the Triton
            kernels on the roofline from inductor's estimates (None: nothing compiled in the trace).
    """

    file: str
    rank: int | None
    world_size: int | None
    backend: str | None
    host: str | None
    iterations: list[int] | None
    parallel: dict[str, int] | None
    base_time_ns: int
    events: int
    uncompressed_bytes: int
    steps: list[StepTime]
    step_mean_us: float | None
    work_mean_us: float | None
    gpu: GpuBreakdown | None
    cpu: CpuThreads | None
    top_kernels: list[KernelTotal]
    top_cpu_ops: list[OperatorTotal]
    top_cpu_ops_by_self: list[OperatorTotal]
    top_ops_by_device: list[OperatorTotal]
    memory: list[MemoryPeak]
    ops_in_steps: StepOps
    fsdp: list[FsdpPhase]
    fsdp_step: FsdpStepSplit | None
    compiled: CompiledCode | None = None


_decoder = msgspec.json.Decoder(Summary)


def decode_summary(data: bytes | msgspec.Raw) -> Summary:
    """A summary from its JSON (a sidecar's ``summary``), checked against the schema.

    Args:
        data: the JSON.

    Returns:
        The summary.

    Raises:
        msgspec.DecodeError: not JSON; ``msgspec.ValidationError``: not a summary.
    """
    return _decoder.decode(data)
