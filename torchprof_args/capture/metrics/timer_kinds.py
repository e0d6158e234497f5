"""One step timer, in each of its kinds: host clock, CUDA events, synchronizing, NVTX, dummy.

:class:`~torchprof_args.capture.metrics.timers.Timers` picks the kind once per timer: host
``time.perf_counter`` on CPU, :class:`CudaEventTimer` (two pooled CUDA events per start/stop,
resolved when read: no device synchronize) on GPU, :class:`SynchronizingTimer` with
``--timing-synchronize`` (Megatron's behaviour), each wrapped in :class:`NvtxTimer` under
``--torch-profile-nsys``.  Timers above the log level are the shared :class:`DummyTimer`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from torchprof_args import _dist
from torchprof_args.errors import TimerError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "CudaEventTimer", "DummyTimer", "EventPool", "NvtxRanges", "NvtxTimer", "SynchronizingTimer", "Timer",
    "TimingEvent", "group_barrier",
]

#: Event pairs a CUDA timer keeps before it folds the already-completed ones into its total.
_MAX_PENDING_EVENT_PAIRS = 256

_perf_counter = time.perf_counter


class NvtxRanges(Protocol):
    """NVTX ranges (``torch.cuda.nvtx``; :class:`~torchprof_args.capture.runtime.nsys.CudaNsysBackend`)."""

    def range_push(self, name: str) -> object: ...
    def range_pop(self) -> object: ...


class TimingEvent(Protocol):
    """What :class:`CudaEventTimer` uses of ``torch.cuda.Event(enable_timing=True)``."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any) -> float: ...  # Any: torch's own signature names Event


def group_barrier(group: ProcessGroup | None) -> None:
    """A barrier on ``group`` when several ranks run (Megatron's ``start(barrier=True)``)."""
    dist = _dist.dist_if_initialized()
    if dist is not None and dist.get_world_size(group) > 1:
        dist.barrier(group=group)


class DummyTimer:
    """Returned for timers above the log level: start/stop cost a function call and nothing else."""

    name = "dummy timer"

    def start(self, barrier: bool = False) -> None:
        return

    def stop(self, barrier: bool = False) -> None:
        return

    def reset(self) -> None:
        return

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        raise TimerError(
            "a dummy timer has no elapsed time: the timer's log_level is above the Timers' "
            "log level (raise --timing-log-level to measure it)."
        )

    def active_time(self) -> float:
        raise TimerError(
            "a dummy timer has no active time: the timer's log_level is above the Timers' "
            "log level (raise --timing-log-level to measure it)."
        )


class Timer:
    """A host timer (``time.perf_counter``): start/stop pairs accumulate until read.

    ``elapsed()`` returns the accumulated seconds since the last reset; ``active_time()`` the
    seconds over the timer's whole life (never reset), as in Megatron.
    """

    __slots__ = ("name", "_elapsed", "_active", "_start_time", "_started", "_count", "_barrier_group")

    def __init__(self, name: str) -> None:
        self.name = name
        self._elapsed = 0.0
        self._active = 0.0
        self._start_time = 0.0
        self._started = False
        #: start/stop pairs since the last reset: 0 means "not run this interval".
        self._count = 0
        self._barrier_group: ProcessGroup | None = None

    def set_barrier_group(self, barrier_group: ProcessGroup | None) -> None:
        """Process group used by ``start(barrier=True)``/``stop(barrier=True)``."""
        self._barrier_group = barrier_group

    def start(self, barrier: bool = False) -> None:
        """Start timing; ``barrier`` waits for all ranks of the barrier group first."""
        if self._started:
            raise TimerError(f"timer {self.name!r} has already been started; stop it first.")
        if barrier:
            group_barrier(self._barrier_group)
        self._started = True
        self._start_time = _perf_counter()

    def stop(self, barrier: bool = False) -> None:
        """Stop timing and add the interval to the elapsed and active time."""
        now = _perf_counter()
        if not self._started:
            raise TimerError(f"timer {self.name!r} is not started; start it before stopping it.")
        if barrier:
            group_barrier(self._barrier_group)
            now = _perf_counter()
        seconds = now - self._start_time
        self._elapsed += seconds
        self._active += seconds
        self._count += 1
        self._started = False

    def reset(self) -> None:
        """Forget the elapsed time (not the active time) and stop the timer."""
        self._elapsed = 0.0
        self._count = 0
        self._started = False

    def set_elapsed(self, value: float) -> None:
        """Inject a pre-computed elapsed time (seconds), e.g. a start-up duration."""
        self._elapsed = float(value)
        self._count = max(self._count, 1)

    def elapsed(self, reset: bool = True, barrier: bool = False) -> float:
        """Seconds accumulated since the last reset; a running timer keeps running."""
        running = self._started
        if running:
            self.stop(barrier=barrier)
        self._settle()
        seconds = self._elapsed
        if reset:
            self.reset()
        if running:
            self.start(barrier=barrier)
        return seconds

    def active_time(self) -> float:
        """Seconds this timer has been running over its whole life."""
        self._settle()
        return self._active

    def _settle(self) -> None:
        """Bring ``_elapsed``/``_active`` up to date (device timers resolve their events here)."""

    def _elapsed_for_gather(self, reset: bool) -> float:
        """Elapsed seconds, or NaN when the timer did not run since the last reset."""
        ran = self._count > 0 or self._started
        seconds = self.elapsed(reset=reset)
        return seconds if ran else math.nan


class NvtxTimer:
    """An NVTX range around every start/stop of the wrapped timer (``--torch-profile-nsys``), so
    Nsight Systems shows the timers beside the step ranges."""

    __slots__ = ("_timer", "_nvtx")

    def __init__(self, timer: Timer, nvtx: NvtxRanges) -> None:
        self._timer = timer
        self._nvtx = nvtx

    def start(self, barrier: bool = False) -> None:
        self._nvtx.range_push(self._timer.name)
        self._timer.start(barrier)

    def stop(self, barrier: bool = False) -> None:
        self._timer.stop(barrier)
        self._nvtx.range_pop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._timer, name)


class SynchronizingTimer(Timer):
    """Megatron's behaviour: synchronize the device at every start and stop."""

    __slots__ = ("_synchronize",)

    def __init__(self, name: str, synchronize: Callable[[], None]) -> None:
        super().__init__(name)
        self._synchronize = synchronize

    def start(self, barrier: bool = False) -> None:
        if self._started:
            raise TimerError(f"timer {self.name!r} has already been started; stop it first.")
        if barrier:
            group_barrier(self._barrier_group)
        self._synchronize()
        self._started = True
        self._start_time = _perf_counter()

    def stop(self, barrier: bool = False) -> None:
        if not self._started:
            raise TimerError(f"timer {self.name!r} is not started; start it before stopping it.")
        if barrier:
            group_barrier(self._barrier_group)
        self._synchronize()
        seconds = _perf_counter() - self._start_time
        self._elapsed += seconds
        self._active += seconds
        self._count += 1
        self._started = False


class EventPool:
    """Reusable ``torch.cuda.Event(enable_timing=True)`` objects (creating them is not free)."""

    def __init__(self, torch_module: Any) -> None:  # Any: torch, or a stand-in with cuda.Event
        self._event_class: Callable[..., TimingEvent] = torch_module.cuda.Event
        self._free: list[TimingEvent] = []

    def get(self) -> TimingEvent:
        return self._free.pop() if self._free else self._event_class(enable_timing=True)

    def put(self, *events: TimingEvent) -> None:
        self._free.extend(events)


class CudaEventTimer(Timer):
    """Times device work with CUDA events on the current stream, resolved when read.

    The measured interval runs from when the stream reaches the start event to when it reaches
    the stop event: device time when the GPU is the bottleneck, and (because an idle stream
    executes the event immediately) host time when the host is.  No device synchronize happens
    at start/stop; reading waits only for the last stop event.
    """

    __slots__ = ("_pool", "_start_event", "_pending")

    def __init__(self, name: str, pool: EventPool) -> None:
        super().__init__(name)
        self._pool = pool
        self._start_event: TimingEvent | None = None
        self._pending: list[tuple[TimingEvent, TimingEvent]] = []

    def start(self, barrier: bool = False) -> None:
        if self._started:
            raise TimerError(f"timer {self.name!r} has already been started; stop it first.")
        if barrier:
            group_barrier(self._barrier_group)
        event = self._pool.get()
        event.record()
        self._start_event = event
        self._started = True

    def stop(self, barrier: bool = False) -> None:
        if not self._started:
            raise TimerError(f"timer {self.name!r} is not started; start it before stopping it.")
        if barrier:
            group_barrier(self._barrier_group)
        start_event, self._start_event = self._start_event, None
        assert start_event is not None  # start() recorded it
        event = self._pool.get()
        event.record()
        self._pending.append((start_event, event))
        self._count += 1
        self._started = False
        if len(self._pending) >= _MAX_PENDING_EVENT_PAIRS:
            self._resolve(block=False)

    def _resolve(self, block: bool) -> None:
        """Fold completed event pairs into the totals; ``block`` waits for all of them."""
        if not self._pending:
            return
        if block:
            self._pending[-1][1].synchronize()
        still_running: list[tuple[TimingEvent, TimingEvent]] = []
        for start_event, stop_event in self._pending:
            if not block and not stop_event.query():
                still_running.append((start_event, stop_event))
                continue
            seconds = start_event.elapsed_time(stop_event) / 1000.0
            self._elapsed += seconds
            self._active += seconds
            self._pool.put(start_event, stop_event)
        self._pending = still_running

    def reset(self) -> None:
        self._resolve(block=True)
        if self._start_event is not None:
            self._pool.put(self._start_event)
            self._start_event = None
        super().reset()

    def set_elapsed(self, value: float) -> None:
        self._resolve(block=True)
        super().set_elapsed(value)

    def _settle(self) -> None:
        self._resolve(block=True)
