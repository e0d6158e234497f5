"""What profiling costs this rank's training, measured while it runs (``prof.stats``' running totals).

Four parts, each in seconds of this rank's wall time:

* **flush stalls**: the step that writes a trace waits for torch.profiler's ``stop()``, the hand-off
  to the exporter and the fence (every rank, traced or not, waits there);
* **snapshot dumps**: the fence after an interval memory snapshot;
* **recording**: recorded (and warm-up) steps run slower than unprofiled ones;
* **publishing**: steps run slower while this rank's exporter and publisher compress and summarise
  a trace (:mod:`~torchprof_args.capture.runtime.export.priority` keeps this small).

The first two are timed directly.  The last two are the extra time of the steps taken in that state
over a baseline: the mean step time of the recent *quiet* stretches (steps between two of the
profiler's busy steps with nothing recorded and nothing being published).  The profiler timestamps
only its busy steps (and, while a publisher runs, every step: one ``perf_counter`` call each), so
idle steps keep their one-comparison hot path.  A stretch measured before any quiet one waits for
the first baseline.  The extra time is an upper bound: whatever else slowed those steps (a
checkpoint saved during a recorded step) counts too; the goodput ledger (``torchprof goodput``),
which reads these totals from ``metrics.jsonl``, keeps of it only what the step timers leave
unexplained in each log interval.
"""

from __future__ import annotations

import collections
import enum
import statistics
import time
from typing import Protocol

__all__ = ["ProfilingCost", "StepState"]

#: Quiet stretches whose per-step mean makes the baseline (the median of them).
BASELINE_STRETCHES = 5
#: Measured stretches kept while no baseline exists yet.
MAX_UNRESOLVED = 256


class Publishing(Protocol):
    """The rank's trace writer, as the clock sees it: how many of its publications are in flight."""

    @property
    def in_flight(self) -> int: ...


class StepState(enum.Enum):
    """What the profiler does while the next steps run on this rank."""

    QUIET = "quiet"
    RECORDING = "recording"
    PUBLISHING = "publishing"


class ProfilingCost:
    """This rank's running totals; :meth:`arrive` and :meth:`resume` bracket each busy step."""

    def __init__(self) -> None:
        self.flush_seconds = 0.0
        self.snapshot_seconds = 0.0
        #: The last fence's stall (``prof.stats["flush_seconds"]``: the last flush or snapshot).
        self.last_stall = 0.0
        self._extra = {StepState.RECORDING: 0.0, StepState.PUBLISHING: 0.0}
        self._baselines: collections.deque[float] = collections.deque(maxlen=BASELINE_STRETCHES)
        self._unresolved: list[tuple[StepState, int, float]] = []
        self._mark: tuple[int, float, StepState] | None = None

    def resume(
        self, iteration: int, recording: bool, writer: Publishing | None, now: float | None = None
    ) -> bool:
        """The profiler's work at the step ending ``iteration`` is done: the following steps are
        recorded, or run beside this rank's publishers, or are quiet.  Returns whether a publisher
        runs (then the profiler stops the clock at every step)."""
        publishing = writer is not None and writer.in_flight > 0
        state = StepState.RECORDING if recording else StepState.PUBLISHING if publishing else StepState.QUIET
        self._mark = (iteration, time.perf_counter() if now is None else now, state)
        return state is StepState.PUBLISHING

    def arrive(self, iteration: int, now: float | None = None) -> None:
        """The step ending ``iteration`` reached the profiler (``now``: ``perf_counter``): close the
        stretch since the last :meth:`resume` (its steps' own work only)."""
        now = time.perf_counter() if now is None else now
        mark, self._mark = self._mark, None
        if mark is None or iteration <= mark[0]:
            return
        first, since, state = mark
        steps, seconds = iteration - first, now - since
        if state is StepState.QUIET:
            self._baselines.append(seconds / steps)
        else:
            self._unresolved.append((state, steps, seconds))
            del self._unresolved[:-MAX_UNRESOLVED]
        self._resolve()

    def stall(self, what: str, seconds: float) -> None:
        """A fence the profiler made every rank wait at: ``what`` is the fence's reason."""
        self.last_stall = seconds
        if what == "flush":
            self.flush_seconds += seconds
        else:
            self.snapshot_seconds += seconds

    @property
    def baseline(self) -> float | None:
        """Seconds per quiet step (None before the first quiet stretch)."""
        return statistics.median(self._baselines) if self._baselines else None

    def _resolve(self) -> None:
        baseline = self.baseline
        if baseline is None:
            return
        for state, steps, seconds in self._unresolved:
            self._extra[state] += seconds - steps * baseline
        self._unresolved.clear()

    def figures(self) -> dict[str, float]:
        """Running totals, seconds (``prof.stats`` keys): the extra-time parts are estimates and never
        reported below 0; ``cost_seconds_total`` is their sum with the stalls."""
        recording = max(0.0, self._extra[StepState.RECORDING])
        publishing = max(0.0, self._extra[StepState.PUBLISHING])
        return {
            "flush_seconds_total": self.flush_seconds,
            "snapshot_seconds_total": self.snapshot_seconds,
            "recording_extra_seconds_total": recording,
            "publishing_extra_seconds_total": publishing,
            "cost_seconds_total": self.flush_seconds + self.snapshot_seconds + recording + publishing,
        }
