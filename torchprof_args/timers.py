"""Step timers: a drop-in for ``megatron.core.timers.Timers`` that works everywhere.

Differences from Megatron's timers, all aimed at production jobs:

* CPU-only runs work (``time.perf_counter``; torch is not even needed to time).
* On GPU a timer records two CUDA events on the current stream per start/stop instead of
  synchronizing the whole device twice; the events are resolved lazily when the timers are read
  (``log``/``write``/``elapsed``), so timing never serializes the host with the device.
  ``synchronize=True`` (``--timing-synchronize``) restores Megatron's synchronizing behaviour.
* Reading timers across ranks is one collective per log interval for all names together.  The
  collective carries a fingerprint of the name list, so ranks that ask for different names get a
  clear error naming the differing timers instead of a silent hang or garbage.

Semantics (log levels 0/1/2 with dummy timers above the level; log options ``max``, ``minmax``,
``all``; ``normalizer``; ``reset``; ``barrier``) follow Megatron's.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from torchprof_args.log import get_logger

__all__ = ["Timers", "Timer", "DummyTimer", "TimerError", "TimerNamesMismatchError", "TimerSnapshot"]

logger = get_logger("torchprof_args.timers")

_MAX_LOG_LEVEL = 2
_LOG_OPTIONS = ("max", "minmax", "all")
#: Event pairs a CUDA timer keeps before it folds the already-completed ones into its total.
_MAX_PENDING_EVENT_PAIRS = 256

_perf_counter = time.perf_counter


class TimerError(RuntimeError, AssertionError):
    """A timer used the wrong way (started twice, stopped while not running, ...).

    Also an ``AssertionError`` because Megatron's timers assert in these cases, so code that
    catches those keeps working.
    """


class TimerNamesMismatchError(RuntimeError):
    """Ranks called ``Timers.log``/``write`` with different timer names."""


def _dist_state(group: Any = None) -> tuple[Any, int, int]:
    """``(torch.distributed or None, rank, world_size)`` without importing torch needlessly."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist, dist.get_rank(), dist.get_world_size(group)
    return None, 0, 1


def _barrier(group: Any) -> None:
    dist, _, world_size = _dist_state(group)
    if dist is not None and world_size > 1:
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
        self._barrier_group: Any = None

    def set_barrier_group(self, barrier_group: Any) -> None:
        """Process group used by ``start(barrier=True)``/``stop(barrier=True)``."""
        self._barrier_group = barrier_group

    def start(self, barrier: bool = False) -> None:
        """Start timing; ``barrier`` waits for all ranks of the barrier group first."""
        if self._started:
            raise TimerError(f"timer {self.name!r} has already been started; stop it first.")
        if barrier:
            _barrier(self._barrier_group)
        self._started = True
        self._start_time = _perf_counter()

    def stop(self, barrier: bool = False) -> None:
        """Stop timing and add the interval to the elapsed and active time."""
        now = _perf_counter()
        if not self._started:
            raise TimerError(f"timer {self.name!r} is not started; start it before stopping it.")
        if barrier:
            _barrier(self._barrier_group)
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


class _NvtxTimer:
    """An NVTX range around every start/stop of the wrapped timer (``--torch-profile-nsys``), so
    Nsight Systems shows the timers beside the step ranges."""

    __slots__ = ("_timer", "_nvtx")

    def __init__(self, timer: Timer, nvtx: Any) -> None:
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


class _SynchronizingTimer(Timer):
    """Megatron's behaviour: synchronize the device at every start and stop."""

    __slots__ = ("_synchronize",)

    def __init__(self, name: str, synchronize: Any) -> None:
        super().__init__(name)
        self._synchronize = synchronize

    def start(self, barrier: bool = False) -> None:
        if self._started:
            raise TimerError(f"timer {self.name!r} has already been started; stop it first.")
        if barrier:
            _barrier(self._barrier_group)
        self._synchronize()
        self._started = True
        self._start_time = _perf_counter()

    def stop(self, barrier: bool = False) -> None:
        if not self._started:
            raise TimerError(f"timer {self.name!r} is not started; start it before stopping it.")
        if barrier:
            _barrier(self._barrier_group)
        self._synchronize()
        seconds = _perf_counter() - self._start_time
        self._elapsed += seconds
        self._active += seconds
        self._count += 1
        self._started = False


class _EventPool:
    """Reusable ``torch.cuda.Event(enable_timing=True)`` objects (creating them is not free)."""

    def __init__(self, torch_module: Any) -> None:
        self._event_class = torch_module.cuda.Event
        self._free: list[Any] = []

    def get(self) -> Any:
        return self._free.pop() if self._free else self._event_class(enable_timing=True)

    def put(self, *events: Any) -> None:
        self._free.extend(events)


class _CudaEventTimer(Timer):
    """Times device work with CUDA events on the current stream, resolved when read.

    The measured interval runs from when the stream reaches the start event to when it reaches
    the stop event: device time when the GPU is the bottleneck, and (because an idle stream
    executes the event immediately) host time when the host is.  No device synchronize happens
    at start/stop; reading waits only for the last stop event.
    """

    __slots__ = ("_pool", "_start_event", "_pending")

    def __init__(self, name: str, pool: _EventPool) -> None:
        super().__init__(name)
        self._pool = pool
        self._start_event: Any = None
        self._pending: list[tuple[Any, Any]] = []

    def start(self, barrier: bool = False) -> None:
        if self._started:
            raise TimerError(f"timer {self.name!r} has already been started; stop it first.")
        if barrier:
            _barrier(self._barrier_group)
        event = self._pool.get()
        event.record()
        self._start_event = event
        self._started = True

    def stop(self, barrier: bool = False) -> None:
        if not self._started:
            raise TimerError(f"timer {self.name!r} is not started; start it before stopping it.")
        if barrier:
            _barrier(self._barrier_group)
        event = self._pool.get()
        event.record()
        self._pending.append((self._start_event, event))
        self._start_event = None
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
        still_running: list[tuple[Any, Any]] = []
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


@dataclasses.dataclass
class TimerSnapshot:
    """Timer readings of every rank from one collective.

    ``times[r][i]`` is rank ``r``'s seconds for ``names[i]`` (NaN where that rank did not run
    the timer); ``per_rank[r]`` is the extra payload rank ``r`` sent along (or ``None``).
    """

    names: list[str]
    times: list[list[float]]
    per_rank: list[Any]

    @property
    def world_size(self) -> int:
        return len(self.times)

    def rank_times(self, name: str) -> list[float]:
        """Seconds of ``name`` on each rank (NaN where it did not run)."""
        index = self.names.index(name)
        return [row[index] for row in self.times]

    def min_max(self, normalizer: float = 1.0) -> dict[str, tuple[float, float]]:
        """``name -> (min, max)`` seconds across the ranks that ran it, divided by ``normalizer``."""
        result: dict[str, tuple[float, float]] = {}
        for index, name in enumerate(self.names):
            values = [row[index] for row in self.times if not math.isnan(row[index])]
            if values:
                result[name] = (min(values) / normalizer, max(values) / normalizer)
        return result


def _fingerprint(names: Sequence[str]) -> int:
    return zlib.crc32("\x00".join(names).encode("utf-8"))


def _describe_mismatch(names_by_rank: list[list[str]]) -> str:
    reference = names_by_rank[0]
    problems: list[str] = []
    for rank, names in enumerate(names_by_rank[1:], start=1):
        if names == reference:
            continue
        missing = [n for n in reference if n not in names]
        extra = [n for n in names if n not in reference]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"lacks {missing}")
            if extra:
                parts.append(f"has extra {extra}")
            problems.append(f"rank {rank} {' and '.join(parts)} compared with rank 0")
        else:
            problems.append(f"rank {rank} lists the same names in a different order ({names})")
        if len(problems) >= 4:
            problems.append("...")
            break
    return "; ".join(problems)


class Timers:
    """A group of named timers, a drop-in for ``megatron.core.timers.Timers``.

    ``Timers(log_level, log_option)``; ``timers(name, log_level=None)`` returns the timer
    (a no-op dummy when ``log_level`` is above the group's).  ``device`` is ``"auto"`` (CUDA
    events when CUDA is available, else host timers), ``"cuda"`` or ``"cpu"``; ``synchronize``
    selects Megatron's synchronize-per-start/stop behaviour on CUDA.  ``group`` is the process
    group the readings are gathered over (default: the whole world).
    """

    def __init__(
        self,
        log_level: int = 0,
        log_option: str = "minmax",
        *,
        synchronize: bool = False,
        device: str = "auto",
        group: Any = None,
        nvtx: Any = None,
    ) -> None:
        if log_level not in (0, 1, 2):
            raise ValueError(f"Timers log_level must be 0, 1 or 2, got {log_level!r}.")
        if log_option not in _LOG_OPTIONS:
            raise ValueError(
                f"Timers log_option must be one of {', '.join(_LOG_OPTIONS)}, got {log_option!r}."
            )
        if device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"Timers device must be 'auto', 'cuda' or 'cpu', got {device!r}.")
        self._log_level = log_level
        self._log_option = log_option
        self._timers: dict[str, Timer] = {}
        self._log_levels: dict[str, int] = {}
        self._dummy_timer = DummyTimer()
        self._max_log_level = _MAX_LOG_LEVEL
        self._group = group
        self.synchronize = synchronize
        self.device = self._resolve_device(device)
        self._event_pool: _EventPool | None = None
        #: Something with ``range_push(name)``/``range_pop()`` (NVTX), or None.
        self._nvtx = nvtx

    @classmethod
    def from_args(cls, args: Any, **kwargs: Any) -> Timers:
        """Timers configured by ``--timing-log-level``, ``--timing-log-option`` and
        ``--timing-synchronize`` (Megatron-LM's own args namespace works too); with
        ``--torch-profile-nsys`` on CUDA every timer is also an NVTX range."""
        timers = cls(
            getattr(args, "timing_log_level", 0) or 0,
            getattr(args, "timing_log_option", None) or "minmax",
            synchronize=bool(getattr(args, "timing_synchronize", False)),
            **kwargs,
        )
        if getattr(args, "torch_profile_nsys", False) and timers.device == "cuda" and timers._nvtx is None:
            from torchprof_args.nsys import CudaNsysBackend

            timers._nvtx = CudaNsysBackend()
        return timers

    @staticmethod
    def _resolve_device(device: str) -> str:
        if device == "cpu":
            return "cpu"
        try:
            import torch
        except ImportError:
            torch = None  # type: ignore[assignment]
        available = torch is not None and torch.cuda.is_available()
        if device == "cuda" and not available:
            logger.warning("Timers(device='cuda') but CUDA is not available; timing on the host instead.")
        return "cuda" if available else "cpu"

    @property
    def log_level(self) -> int:
        return self._log_level

    @property
    def log_option(self) -> str:
        return self._log_option

    def names(self) -> list[str]:
        """Names of the timers created on this rank, in creation order."""
        return list(self._timers)

    def _new_timer(self, name: str) -> Timer:
        timer = self._new_device_timer(name)
        return _NvtxTimer(timer, self._nvtx) if self._nvtx is not None else timer  # type: ignore[return-value]

    def _new_device_timer(self, name: str) -> Timer:
        if self.device != "cuda":
            return Timer(name)
        import torch

        if self.synchronize:
            return _SynchronizingTimer(name, torch.cuda.synchronize)
        if self._event_pool is None:
            self._event_pool = _EventPool(torch)
        return _CudaEventTimer(name, self._event_pool)

    def __call__(self, name: str, log_level: int | None = None) -> Timer | DummyTimer:
        """The timer called ``name``, created on first use at ``log_level`` (default 2)."""
        timer = self._timers.get(name)
        if timer is not None:
            if log_level is not None and log_level != self._log_levels[name]:
                raise TimerError(
                    f"timer {name!r} was created with log level {self._log_levels[name]}, "
                    f"not {log_level}; use one log level per timer name."
                )
            return timer
        if log_level is None:
            log_level = self._max_log_level
        if not 0 <= log_level <= self._max_log_level:
            raise TimerError(
                f"timer {name!r}: log level {log_level} is outside 0..{self._max_log_level}."
            )
        if log_level > self._log_level:
            return self._dummy_timer
        timer = self._new_timer(name)
        self._timers[name] = timer
        self._log_levels[name] = log_level
        return timer

    # -- reading across ranks ----------------------------------------------------------------

    def gather(
        self,
        names: Iterable[str] | None = None,
        reset: bool = True,
        barrier: bool = False,
        per_rank: Any = None,
    ) -> TimerSnapshot:
        """Read ``names`` on every rank with one collective (every rank must call it).

        ``names=None`` means every timer any rank created (each rank sends its own list, the
        union is returned).  Explicit ``names`` must be the same list on every rank, as in
        Megatron; otherwise every rank raises :class:`TimerNamesMismatchError` naming the
        differences.  ``per_rank`` is any picklable payload carried along in the same
        collective (the metrics writer sends memory and profiler figures this way).
        """
        union = names is None
        name_list = list(self._timers) if union else list(names)
        if barrier:
            _barrier(self._group)
        local = [
            self._timers[name]._elapsed_for_gather(reset) if name in self._timers else math.nan
            for name in name_list
        ]
        dist, _, world_size = _dist_state(self._group)
        if dist is None or world_size == 1:
            return TimerSnapshot(name_list, [local], [per_rank])

        key: Any = tuple(name_list) if union else _fingerprint(name_list)
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, (key, local, per_rank), group=self._group)
        if union:
            all_names: list[str] = []
            seen: set[str] = set()
            for rank_names, _, _ in gathered:
                for name in rank_names:
                    if name not in seen:
                        seen.add(name)
                        all_names.append(name)
            times = []
            for rank_names, rank_times, _ in gathered:
                by_name = dict(zip(rank_names, rank_times, strict=True))
                times.append([by_name.get(name, math.nan) for name in all_names])
            return TimerSnapshot(all_names, times, [payload for _, _, payload in gathered])

        if any(item[0] != key or len(item[1]) != len(name_list) for item in gathered):
            # Every rank sees the same gathered fingerprints, so every rank takes this branch
            # and the second collective below cannot hang.
            names_by_rank: list[Any] = [None] * world_size
            dist.all_gather_object(names_by_rank, name_list, group=self._group)
            raise TimerNamesMismatchError(
                "Timers.log/write must be called with the same timer names on every rank: "
                f"{_describe_mismatch(names_by_rank)}. Pass one list of names on all ranks "
                "(or names=None to log the union of all timers)."
            )
        return TimerSnapshot(name_list, [item[1] for item in gathered], [item[2] for item in gathered])

    def _get_elapsed_time_all_ranks(self, names: Sequence[str], reset: bool, barrier: bool) -> list[list[float]]:
        """Megatron's helper name: ``[rank][name]`` seconds, 0.0 where a rank did not run it."""
        snapshot = self.gather(names, reset=reset, barrier=barrier)
        return [[0.0 if math.isnan(t) else t for t in row] for row in snapshot.times]

    def get_all_timers_string(
        self,
        names: Sequence[str] | None = None,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> str | None:
        """Megatron's report text (milliseconds) for ``names``; ``None`` when nothing ran."""
        if not normalizer > 0.0:
            raise ValueError(f"normalizer must be > 0, got {normalizer}.")
        snapshot = self.gather(names, reset=reset, barrier=barrier)
        return format_snapshot(snapshot, self._log_option, normalizer)

    def log(
        self,
        names: Sequence[str] | None,
        rank: int | None = None,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> str | None:
        """Log the timers (ms) on ``rank`` (default the last); every rank must call this."""
        text = self.get_all_timers_string(names, normalizer, reset, barrier)
        _, this_rank, world_size = _dist_state(self._group)
        if rank is None:
            rank = world_size - 1
        if rank == this_rank and text is not None:
            logger.info(text)
            return text
        return None

    def write(
        self,
        names: Sequence[str] | None,
        writer: Any,
        iteration: int,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> dict[str, float]:
        """Write ``timers/<name>-time`` (max across ranks, seconds / ``normalizer``) to ``writer``.

        With log option ``minmax`` or ``all`` the minimum goes to ``timers/<name>-time-min`` too.
        ``writer`` is anything with ``add_scalar(tag, value, step)`` (a TensorBoard
        ``SummaryWriter``, :class:`torchprof_args.MetricsWriter`), the ``wandb`` module or a run
        (``log(dict, step=...)``), or ``None`` on ranks that do not write.  Every rank must call
        this.  Returns the scalars written.
        """
        if not normalizer > 0.0:
            raise ValueError(f"normalizer must be > 0, got {normalizer}.")
        snapshot = self.gather(names, reset=reset, barrier=barrier)
        scalars = timer_scalars(snapshot.min_max(normalizer), self._log_option)
        if writer is not None and scalars:
            add_scalar = getattr(writer, "add_scalar", None)
            if add_scalar is not None:
                for tag, value in scalars.items():
                    add_scalar(tag, value, iteration)
            elif hasattr(writer, "log"):
                writer.log(scalars, step=iteration)
            else:
                raise TypeError(
                    f"Timers.write: writer {type(writer).__name__} has neither add_scalar(tag, value, "
                    "step) nor log(dict, step=); pass a SummaryWriter, wandb, or a MetricsWriter."
                )
        return scalars


def timer_scalars(min_max: dict[str, tuple[float, float]], log_option: str) -> dict[str, float]:
    """Megatron-style keys: ``timers/<name>-time`` (max) and, unless ``max``, ``-time-min``."""
    scalars: dict[str, float] = {}
    for name, (low, high) in min_max.items():
        scalars[f"timers/{name}-time"] = high
        if log_option != "max":
            scalars[f"timers/{name}-time-min"] = low
    return scalars


def format_snapshot(snapshot: TimerSnapshot, log_option: str, normalizer: float = 1.0) -> str | None:
    """Megatron's text report of a snapshot, in milliseconds."""
    scale = 1000.0 / normalizer
    if log_option == "all":
        lines = ["times across ranks (ms):"]
        for index, name in enumerate(snapshot.names):
            rows = [
                f"     rank {rank:2d}: {row[index] * scale:.2f}"
                for rank, row in enumerate(snapshot.times)
                if not math.isnan(row[index])
            ]
            if rows:
                lines.append(f"  {name}:")
                lines += rows
        return "\n".join(lines) if len(lines) > 1 else None
    min_max = snapshot.min_max(normalizer / 1000.0)
    if not min_max:
        return None
    if log_option == "max":
        lines = ["max time across ranks (ms):"]
        lines += [f"    {(name + ' ').ljust(48, '.')}: {high:.2f}" for name, (_, high) in min_max.items()]
    else:
        lines = ["(min, max) time across ranks (ms):"]
        lines += [
            f"    {(name + ' ').ljust(48, '.')}: ({low:.2f}, {high:.2f})"
            for name, (low, high) in min_max.items()
        ]
    return "\n".join(lines)
