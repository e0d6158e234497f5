"""Memory by category from PyTorch's own memory profiler, while the profiler's results exist.

``torch.profiler._memory_profiler.MemoryProfile`` categorises every tensor of a profiled window
(parameters and optimizer state from the Python tracer's view of ``nn.Module`` and
``Optimizer.step`` calls, gradients from ``AccumulateGrad``, the rest by data flow) but needs the
profiler's in-memory results (``profile.profiler.kineto_results``, with ``record_shapes``,
``profile_memory`` and ``with_stack``), which no trace file holds.  So it runs where the results
still are: in the forked exporter (:mod:`torchprof_args.capture.runtime.export.child`), which writes
:func:`memory_part`'s result beside the staged trace for the publisher to keep in the sidecar.

**One correction.**  Read as it is, its timeline puts an optimizer step's workspace under
``PARAMETER`` and ``ACTIVATION``: Adam's ``exp_avg_sq.sqrt()`` (one tensor the size of the parameter
being updated) passes its data-flow test for parameters (made from a tensor that depends on a
gradient, used to update a parameter that is used to compute the next gradient), and the division
that follows is flooded as an activation.  Measured on an MLP of 33.6 MB of fp32 parameters with
Adam: 50.4 MB of "parameters" at the peak (in the optimizer step), one such tensor too many.
Every tensor made inside ``Optimizer.step`` that the Python tracer lists neither as a parameter
nor as optimizer state is that step's workspace, and is counted as ``temporary`` here
(``tests/test_memory_categories.py`` checks it against the analytic sizes).

Import-light: torch is imported by :func:`memory_part` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from torchprof_args.analysis.memory.breakdown import BEFORE_WINDOW, Allocations, Where, breakdown
from torchprof_args.analysis.memory.categories import (
    ACTIVATION,
    GRADIENT,
    OPTIMIZER_STATE,
    OTHER,
    PARAMETER,
    TEMPORARY,
    MemoryPart,
)
from torchprof_args.analysis.memory.places import BACKWARD, MARKERS, PhaseClock, PlaceNamer
from torchprof_args.shared import formats

__all__ = ["PYTORCH_CATEGORY", "memory_part"]

#: PyTorch's categories (``Category.name``; None: uncategorised) -> ours.
PYTORCH_CATEGORY: dict[str | None, int] = {
    "PARAMETER": PARAMETER, "GRADIENT": GRADIENT, "OPTIMIZER_STATE": OPTIMIZER_STATE,
    "ACTIVATION": ACTIVATION, "TEMPORARY": TEMPORARY, "AUTOGRAD_DETAIL": TEMPORARY, "INPUT": OTHER,
    None: OTHER,
}


def memory_part(result: Any) -> MemoryPart:
    """The memory breakdown of one profiled window from PyTorch's categorisation (corrected).

    Args:
        result: the stopped profiler's ``profiler.kineto_results`` (recorded with shapes, memory
            and stacks).

    Returns:
        The part, without rank or coordinates (the publisher adds the trace's).
    """
    from torch.profiler._memory_profiler import MemoryProfile

    profile = MemoryProfile(result)
    rows = _Rows(profile)
    devices = [d for d in (breakdown(a) for a in rows.allocations()) if d is not None]
    devices.sort(key=lambda d: -d.peak_bytes)
    notes = []
    if rows.corrected:
        notes.append(f"{rows.corrected} allocation(s) made inside Optimizer.step that PyTorch's data-flow "
                     "analysis counts as parameters or activations are counted as the step's temporaries")
    return MemoryPart(format=formats.MEMORY.version, source="pytorch", notes=notes, rank=None,
                      world_size=None, stage=None, coordinates=None, devices=devices)


class _Rows:
    """One row per tensor version of PyTorch's timeline, per device, with its category and place."""

    def __init__(self, profile: Any) -> None:
        from torch._C._profiler import _EventType

        self._profile = profile
        self._event_type = _EventType
        self.steps: list[tuple[str, float, float]] = []
        self.window = (float("inf"), float("-inf"))
        marks, backward = self._marks()
        self.namer = PlaceNamer(PhaseClock(marks, backward))
        self.corrected = 0
        self._made: dict[Any, int] = {}  # TensorKey -> where it was allocated
        self._unknown: list[tuple[str, float, float, int, int]] = []  # blocks with no tensor key
        self._params, self._state = self._tracer_sets()
        self._scan()

    def _marks(self) -> tuple[list[tuple[str, float, float]], list[tuple[float, float]]]:
        """The steps, optimizer steps and ``zero_grad`` calls, and the backward pass's operators
        (``(start, end)``); sets the window."""
        marks, backward = [], []
        lo, hi = float("inf"), float("-inf")
        for event in self._profile._op_tree.dfs():
            start = event.start_time_ns / 1e3
            end = event.end_time_ns / 1e3 if event.end_time_ns > 0 else start
            lo, hi = min(lo, start), max(hi, end)
            if event.typed[0] == self._event_type.TorchOp:
                if event.name.startswith(MARKERS):
                    marks.append((event.name, start, end))
                elif event.name.startswith(BACKWARD):
                    backward.append((start, end))
        self.window = (lo, hi)
        self.steps = sorted((m for m in marks if m[0].startswith(MARKERS[0])), key=lambda m: m[1])
        return marks, backward

    def _tracer_sets(self) -> tuple[set[int], set[int]]:
        """Tensor ids the Python tracer saw as parameters and as optimizer state."""
        from torch.profiler._memory_profiler import TensorKey

        params: set[int] = set()
        state: set[int] = set()
        for event in self._profile._op_tree.dfs():
            if event.typed[0] != self._event_type.PyCall:
                continue
            fields = event.typed[1]
            if fields.module is not None:
                keys = (TensorKey.from_tensor(p) for _, p, _ in fields.module.parameters)
                params.update(k.id for k in keys if k)
            if fields.optimizer is not None:
                for p, _, pairs in fields.optimizer.parameters:
                    key = TensorKey.from_tensor(p)
                    if key is not None:
                        params.add(key.id)
                    state.update(k.id for k in (TensorKey.from_tensor(t) for _, t in pairs) if k)
        return params, state

    def _scan(self) -> None:
        """Where each tensor was allocated, and the blocks without a tensor key."""
        from torch.profiler._memory_profiler import TensorKey

        live_unknown: dict[tuple[int, str], tuple[float, int, int]] = {}
        for event in self._profile._op_tree.dfs():
            if event.typed[0] != self._event_type.Allocation:
                continue
            start = event.start_time_ns / 1e3
            fields = event.typed[1]
            key = TensorKey.from_allocation(fields)
            if key is not None:
                if fields.alloc_size > 0:
                    self._made[key] = self.namer.place_of(event)
                continue
            device = str(fields.device)
            slot = (fields.ptr, device)
            if fields.alloc_size > 0:
                live_unknown[slot] = (start, fields.alloc_size, self.namer.place_of(event))
            else:
                made = live_unknown.pop(slot, None) or (float("-inf"), -fields.alloc_size,
                                                        self.namer.index(Where("other")))
                begin, size, where = made
                self._unknown.append((device, begin, start, size, where))
        for (_, device), (begin, size, where) in live_unknown.items():
            self._unknown.append((device, begin, float("inf"), size, where))

    def _versions(self) -> Iterator[tuple[Any, int, float, float, int]]:
        """``(key, version, start, end, size)`` of every tensor version in PyTorch's timeline."""
        from torch.profiler._memory_profiler import Action, TensorKey

        open_: dict[tuple[Any, int], tuple[float, int]] = {}
        for t, action, (key, version), size in self._profile.timeline:
            if not isinstance(key, TensorKey):
                continue  # blocks without a tensor key: from the allocation events (_scan)
            ts = float("-inf") if t == -1 else t / 1e3
            if action in (Action.PREEXISTING, Action.CREATE):
                open_[(key, version)] = (ts, size)
            elif action == Action.INCREMENT_VERSION:
                begin, _ = open_.pop((key, version), (float("-inf"), size))
                yield key, version, begin, ts, size
                open_[(key, version + 1)] = (ts, size)
            elif action == Action.DESTROY:
                begin, _ = open_.pop((key, version), (float("-inf"), size))
                yield key, version, begin, ts, size
        for (key, version), (begin, size) in open_.items():
            yield key, version, begin, float("inf"), size

    def _category(self, key: Any, version: int, where: Where) -> int:
        found = self._profile._categories.get(key, version)
        category = PYTORCH_CATEGORY.get(found.name if found is not None else None, OTHER)
        if where.phase != "optimizer":
            return category
        if key.id in self._state:
            return OPTIMIZER_STATE
        if key.id in self._params:
            return PARAMETER
        if category in (PARAMETER, ACTIVATION, OTHER):
            self.corrected += category in (PARAMETER, ACTIVATION)
            return TEMPORARY
        return category

    def allocations(self) -> list[Allocations]:
        """One table per device."""
        columns: dict[str, list[tuple[float, float, int, int, int]]] = {}
        before = self.namer.index(Where("other", site=BEFORE_WINDOW))  # tensors made before the window
        for key, version, begin, end, size in self._versions():
            where = self._made.get(key, before)
            category = self._category(key, version, self.namer.places[where])
            columns.setdefault(str(key.device), []).append((begin, end, size, category, where))
        for device, begin, end, size, where in self._unknown:
            columns.setdefault(device, []).append((begin, end, size, OTHER, where))
        out = []
        for device, rows in columns.items():
            table = np.array(rows, dtype=np.float64).reshape(-1, 5)
            out.append(Allocations(
                device=device, start=table[:, 0], end=table[:, 1], size=table[:, 2].astype(np.int64),
                category=table[:, 3].astype(np.int8), where=table[:, 4].astype(np.int32),
                places=self.namer.places, window=self.window, steps=self.steps))
        return out

