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
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from torchprof_args import _dist
from torchprof_args.errors import TimerError, TimerNamesMismatchError
from torchprof_args.log import get_logger
from torchprof_args.metrics.config import TimersConfig
from torchprof_args.metrics.timer import (
    CudaEventTimer,
    DummyTimer,
    EventPool,
    NvtxTimer,
    SynchronizingTimer,
    Timer,
)
from torchprof_args.metrics.timer import barrier as group_barrier

__all__ = ["DummyTimer", "Timer", "TimerError", "TimerNamesMismatchError", "TimerSnapshot", "Timers"]

logger = get_logger(__name__)

_MAX_LOG_LEVEL = 2
_LOG_OPTIONS = ("max", "minmax", "all")


@dataclasses.dataclass
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
        self._event_pool: EventPool | None = None
        #: Something with ``range_push(name)``/``range_pop()`` (NVTX), or None.
        self._nvtx = nvtx

    @classmethod
    def from_config(cls, config: TimersConfig, **kwargs: Any) -> Timers:
        """Timers as ``config`` says; with ``config.nvtx`` on CUDA every timer is also an NVTX range."""
        timers = cls(config.log_level, config.log_option, synchronize=config.synchronize, **kwargs)
        if config.nvtx and timers.device == "cuda" and timers._nvtx is None:
            from torchprof_args.runtime.nsys import CudaNsysBackend

            timers._nvtx = CudaNsysBackend()
        return timers

    @classmethod
    def from_args(cls, args: Any, **kwargs: Any) -> Timers:
        """Timers configured by ``--timing-log-level``, ``--timing-log-option`` and
        ``--timing-synchronize`` (Megatron-LM's own args namespace works too); with
        ``--torch-profile-nsys`` on CUDA every timer is also an NVTX range."""
        from torchprof_args.config import configs_from_args

        return cls.from_config(configs_from_args(args).timers, **kwargs)

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
        return NvtxTimer(timer, self._nvtx) if self._nvtx is not None else timer  # type: ignore[return-value]

    def _new_device_timer(self, name: str) -> Timer:
        if self.device != "cuda":
            return Timer(name)
        import torch

        if self.synchronize:
            return SynchronizingTimer(name, torch.cuda.synchronize)
        if self._event_pool is None:
            self._event_pool = EventPool(torch)
        return CudaEventTimer(name, self._event_pool)

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
            group_barrier(self._group)
        local = [
            self._timers[name]._elapsed_for_gather(reset) if name in self._timers else math.nan
            for name in name_list
        ]
        dist = _dist.dist_if_initialized()
        world_size = dist.get_world_size(self._group) if dist is not None else 1
        if dist is None or world_size == 1:
            return TimerSnapshot(name_list, [local], [per_rank])
        key: Any = tuple(name_list) if union else _fingerprint(name_list)
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, (key, local, per_rank), group=self._group)
        if union:
            return _union_snapshot(gathered)
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
        if rank is None:
            rank = _dist.world_size(self._group) - 1
        if rank == _dist.rank() and text is not None:
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


def _union_snapshot(gathered: list[Any]) -> TimerSnapshot:
    """Readings of ranks that each sent their own names: the union of names, NaN where missing."""
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
