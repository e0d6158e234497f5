"""Where an allocation was made, from the names of the events around it: phase, operator, module,
call site.  Shared by the profiler's event tree (:mod:`.pytorch_profile`) and the trace
(:mod:`.trace_memory`), whose events carry the same names: ``ProfilerStep#N``, ``Optimizer.step#
Adam.step``, ``autograd::engine::evaluate_function: ...``, ``nn.Module: Linear_0`` and Python
frames ``path(line): function``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable
from typing import Any

from torchprof_args.analysis.analyzers.event_names import MODULE_PREFIX
from torchprof_args.analysis.memory.breakdown import Where

__all__ = ["BACKWARD", "MARKERS", "PhaseClock", "PlaceNamer", "frame_site", "place_from_names", "python_site"]

_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.*)$")
#: files of these libraries are not the job's own code.
_LIBRARY_PARTS = ("torch/", "/lib/python3", "site-packages/torch", "<", "threading.py", "contextlib.py",
                  "functools.py", "runpy.py", "abc.py", "typing.py")


#: the annotations whose time spans say the phase (``record_function`` ranges: in the profiler's
#: event tree they are not the ancestors of the Python code they enclose, so time decides).
MARKERS = ("ProfilerStep#", "Optimizer.step#", "Optimizer.zero_grad#")
#: the names of the backward pass's operators.
BACKWARD = ("autograd::engine::evaluate_function", "torch::autograd::AccumulateGrad")


class PhaseClock:
    """The phase of a moment: inside ``Optimizer.step`` / ``zero_grad`` by time, in the backward pass
    when an autograd operator encloses it, ``after_backward`` inside a step after its last backward
    operator (gradient reduction, clipping, flattening before the optimizer), else ``forward`` inside
    a step and ``other`` outside.

    Args:
        marks: ``(name, start, end)`` of the :data:`MARKERS` events.
        backward: ``(start, end)`` of the backward pass's operators (:data:`BACKWARD` names).
    """

    def __init__(self, marks: Iterable[tuple[str, float, float]],
                 backward: Iterable[tuple[float, float]] = ()) -> None:
        marks = list(marks)
        self.optimizer = sorted((s, e) for n, s, e in marks if n.startswith(MARKERS[1]))
        self.zero_grad = sorted((s, e) for n, s, e in marks if n.startswith(MARKERS[2]))
        self.steps = sorted((s, e) for n, s, e in marks if n.startswith(MARKERS[0]))
        ops = sorted(backward)
        starts = [start for start, _ in ops]
        #: per step (``steps``' order), when its last backward operator ended (None: no backward pass).
        self.backward_end: list[float | None] = []
        for s, e in self.steps:
            inside = ops[bisect.bisect_left(starts, s):bisect.bisect_right(starts, e)]
            self.backward_end.append(max(end for _, end in inside) if inside else None)

    @staticmethod
    def within(spans: list[tuple[float, float]], ts: float) -> tuple[float, float] | None:
        """The span of ``spans`` (sorted, not overlapping) that holds ``ts``; None when none does."""
        index = bisect.bisect_right(spans, (ts, math.inf)) - 1
        return spans[index] if index >= 0 and spans[index][1] >= ts else None

    def phase(self, ts: float, ops: Iterable[str]) -> str:
        """The phase at ``ts``, within the operators ``ops`` (innermost first)."""
        if self.within(self.optimizer, ts):
            return "optimizer"
        if self.within(self.zero_grad, ts):
            return "zero_grad"
        if any(name.startswith(BACKWARD) for name in ops):
            return "backward"
        index = bisect.bisect_right(self.steps, (ts, math.inf)) - 1
        if index < 0 or self.steps[index][1] < ts:
            return "other"
        ended = self.backward_end[index]
        return "after_backward" if ended is not None and ts > ended else "forward"


def frame_site(name: str) -> str | None:
    """``file: function`` of a Python frame event in the job's own code; None for any other event (an
    operator, a module, a frame of torch or of the standard library).  The line is left out: the
    profiler names a frame by its function's first line, or by where it stood when recording
    began, never by the line that allocated."""
    found = _FRAME.match(name)
    if found is None or any(part in found["file"] for part in _LIBRARY_PARTS):
        return None
    return f"{found['file']}: {found['func']}"


_BUILTIN = re.compile(r"^<built-in (?:method|function) (?P<name>[\w.]+)")


def _callee(name: str) -> str:
    """A short name of the event a frame of the job's code called: ``ones``, ``Linear_0``,
    ``optimizer.wrapper``."""
    if name.startswith(MODULE_PREFIX):
        return name[len(MODULE_PREFIX):]
    builtin = _BUILTIN.match(name)
    if builtin:
        return builtin["name"]
    frame = _FRAME.match(name)
    if frame:
        return f"{frame['file'].rsplit('/', 1)[-1].removesuffix('.py')}.{frame['func']}"
    return name


def python_site(python: list[str]) -> str | None:
    """The call site of an allocation from the Python events around it (innermost first): the
    innermost frame of the job's code and what it called (its outermost module below, else the
    event just inside it), e.g. ``train.py: main > ones``."""
    for j, name in enumerate(python):
        site = frame_site(name)
        if site is None:
            continue
        below = python[:j]
        modules = [n for n in below if n.startswith(MODULE_PREFIX)]
        callee = modules[-1] if modules else below[-1] if below else None
        return f"{site} > {_callee(callee)}" if callee else site
    return None


def place_from_names(phase: str, ops: list[str], python: list[str]) -> Where:
    """The place of an allocation in ``phase`` from the operators around it and the Python events
    around it (frames, modules and C calls), each innermost first."""
    module = next((n[len(MODULE_PREFIX):] for n in python if n.startswith(MODULE_PREFIX)), None)
    return Where(phase=phase, op=ops[0] if ops else None, module=module, site=python_site(python))


class PlaceNamer:
    """Interns :class:`Where` values (``places[index]``) and names the place of a profiler event
    (``torch._C._profiler._ProfilerEvent``) from its ancestors and ``clock``."""

    def __init__(self, clock: PhaseClock | None = None) -> None:
        self.places: list[Where] = []
        self._index: dict[Where, int] = {}
        self.clock = clock or PhaseClock([])

    def index(self, where: Where) -> int:
        """The index of ``where`` in :attr:`places` (added when new)."""
        found = self._index.get(where)
        if found is None:
            found = self._index[where] = len(self.places)
            self.places.append(where)
        return found

    def place_of(self, event: Any) -> int:
        """The index of the place where the profiler event ``event`` happened (at its start)."""
        from torch._C._profiler import _EventType

        ops: list[str] = []
        python: list[str] = []
        node = event.parent
        while node is not None:
            kind = node.typed[0]
            if kind == _EventType.TorchOp:
                ops.append(node.name)
            elif kind in (_EventType.PyCall, _EventType.PyCCall):
                python.append(node.name)
            node = node.parent
        phase = self.clock.phase(event.start_time_ns / 1e3, ops)
        return self.index(place_from_names(phase, ops, python))
