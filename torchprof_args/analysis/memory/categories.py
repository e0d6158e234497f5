"""What memory is for: the categories, the phases of a step, and the memory part's documents.

Six categories, PyTorch's own where it has them (``torch.profiler._memory_profiler.Category``):
``parameter``, ``gradient``, ``optimizer_state``, ``activation`` (tensors the forward pass keeps
for the backward pass), ``temporary`` (made and freed inside one operator, the backward pass's
intermediates, an optimizer step's workspace) and ``other`` (the batch, allocator blocks of unknown
use, anything not told apart).  A phase is where in the step something happened: ``forward``,
``backward``, ``optimizer`` (``Optimizer.step``), ``zero_grad`` or ``other``.

The documents are msgspec structs, kept in a trace's summary sidecar as its ``memory`` part
(:class:`MemoryPart`), field order = JSON key order.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

__all__ = [
    "MEMORY_CATEGORIES", "PHASES", "ByCategory", "DeviceMemory", "MemoryPart", "Moment",
    "Retained", "Site", "StepMemory", "Timeline", "human_bytes",
]

#: every category, in the documents' order (an allocation's category is an index into it).
MEMORY_CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "temporary", "other")
PARAMETER, GRADIENT, OPTIMIZER_STATE, ACTIVATION, TEMPORARY, OTHER = range(len(MEMORY_CATEGORIES))
#: the phases of a training step.
PHASES = ("forward", "backward", "after_backward", "optimizer", "zero_grad", "other")


def human_bytes(n: float | None) -> str:
    """``512.0 MiB`` / ``14.0 GiB`` (GiB from 10 GiB up); ``-`` for None."""
    if n is None:
        return "-"
    return f"{n / 2**30:,.1f} GiB" if abs(n) >= 10 * 2**30 else f"{n / 2**20:,.1f} MiB"


class ByCategory(msgspec.Struct, frozen=True):
    """Bytes per category."""

    parameter: int = 0
    gradient: int = 0
    optimizer_state: int = 0
    activation: int = 0
    temporary: int = 0
    other: int = 0

    @classmethod
    def of(cls, values: Iterable[int]) -> ByCategory:
        """From bytes in :data:`MEMORY_CATEGORIES` order."""
        return cls(*(int(v) for v in values))

    def values(self) -> list[int]:
        """Bytes in :data:`MEMORY_CATEGORIES` order."""
        return [getattr(self, name) for name in MEMORY_CATEGORIES]

    @property
    def total(self) -> int:
        return sum(self.values())


class Moment(msgspec.Struct, frozen=True):
    """When something happened: the time, the step, the phase, the operator, module and call site.

    Attributes:
        ts_us: the time on the trace's clock (Perfetto's), microseconds.
        step: the ``ProfilerStep#N`` it falls in (None: outside every step).
        ms_into_step: milliseconds since that step began.
        phase: one of :data:`PHASES`.
        op: the innermost operator (None: outside every operator).
        module: the innermost ``nn.Module`` (None: not recorded, or outside every module).
        site: the innermost call site in the job's own code, ``file:line (function)``.
    """

    ts_us: float
    step: str | None
    ms_into_step: float | None
    phase: str
    op: str | None
    module: str | None
    site: str | None


class Site(msgspec.Struct, frozen=True):
    """Live bytes of one category allocated at one call site."""

    site: str
    bytes: int
    blocks: int
    category: str


class StepMemory(msgspec.Struct, frozen=True):
    """One step: its peak (bytes, phase, categories), the bytes live at its start and end, and the
    activations its forward pass keeps for the backward pass (live when the backward pass starts;
    None without a backward pass)."""

    step: str
    peak_bytes: int
    phase: str
    by_category: ByCategory
    start_bytes: int
    end_bytes: int
    activations_for_backward_bytes: int | None


class Retained(msgspec.Struct, frozen=True):
    """Memory allocated at one site in several steps and still held at the window's end: a tensor
    kept past its use (a growing list, a loss kept with its graph).

    Attributes:
        site: where it was allocated.
        bytes: what the steps before the last still hold (what freeing it saves now).
        per_step_bytes: what each step adds.
        steps: the steps whose allocations are still held (the last one included).
        category: their category.
    """

    site: str
    bytes: int
    per_step_bytes: int
    steps: int
    category: str


class Timeline(msgspec.Struct, frozen=True):
    """Live bytes per category over the window, at most a few hundred points (each the highest
    moment of its slice of time, so the peak is always one of them)."""

    start_us: float
    t_ms: list[float]
    by_category: dict[str, list[int]]


class DeviceMemory(msgspec.Struct, frozen=True):
    """One device's memory over a profiled window.

    Attributes:
        device: ``cpu`` or ``cuda:N``.
        peak_bytes: the most bytes live at once.
        peak: when that was.
        by_category: what was live then.
        category_peaks: each category's own highest over the window (activations peak when the
            backward pass starts, which need not be the moment of the peak).
        top_sites: the largest allocation sites live then.
        steps: each step's peak.
        retained: tensors kept across steps (largest first).
        timeline: live bytes per category over the window.
        start_bytes: live at the window's start (allocated before it).
        end_bytes: live at its end.
        peak_reserved_bytes: the allocator's highest reservation (CUDA; None when not recorded).
    """

    device: str
    peak_bytes: int
    peak: Moment
    by_category: ByCategory
    category_peaks: ByCategory
    top_sites: list[Site]
    steps: list[StepMemory]
    retained: list[Retained]
    timeline: Timeline
    start_bytes: int
    end_bytes: int
    peak_reserved_bytes: int | None


class MemoryPart(msgspec.Struct, frozen=True):
    """A trace's memory breakdown: the sidecar's ``memory`` part.

    Attributes:
        format: ``formats.MEMORY.version``.
        source: ``pytorch``: PyTorch's own categorisation (``torch.profiler._memory_profiler``),
            computed by the exporter while the profiler's results were in memory, corrected
            (docs/guides/out-of-memory.md); ``trace``: inferred from the trace's ``[memory]`` events,
            operators and modules; ``none``: the trace has no ``[memory]`` events.
        notes: what is less certain, and why the source is not PyTorch's, one sentence each.
        rank: the trace's rank (None: unknown).
        world_size: the job's world size, when the trace says.
        stage: the rank's pipeline stage (the trace's ``torchprof_args.pipeline`` metadata).
        coordinates: its parallel coordinates (dp, tp, pp, cp, ep), when recorded.
        devices: one breakdown per device with ``[memory]`` events, the busiest first.
        fsdp2: the model is FSDP2's (``fully_shard``): its parameters, gradients and optimizer state
            are sharded already.
    """

    format: int
    source: str
    notes: list[str]
    rank: int | None
    world_size: int | None
    stage: int | None
    coordinates: dict[str, int] | None
    devices: list[DeviceMemory]
    fsdp2: bool = False
