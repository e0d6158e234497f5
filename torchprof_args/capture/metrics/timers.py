"""Step timers: a drop-in for ``megatron.core.timers.Timers`` that works everywhere.

Differences from Megatron's timers, all aimed at production jobs:

* CPU-only runs work (``time.perf_counter``; torch is not even needed to time).
* On GPU a timer records two CUDA events on the current stream per start/stop instead of
  synchronizing the whole device twice; the events are resolved lazily when the timers are read
  (``log``/``write``/``elapsed``), so timing never serializes the host with the device.
  ``synchronize=True`` (``--timing-synchronize``) restores Megatron's synchronizing behaviour.
* Reading timers across ranks is one fixed-size float64 all-gather per log interval for all names
  together (:mod:`~torchprof_args.capture.metrics.gather`: the names are agreed once, then only numbers
  travel; no pickling).  Ranks that ask for different names get a clear error naming the
  differing timers instead of a silent hang or garbage.
* The same readings say which rank is slow (:mod:`~torchprof_args.capture.metrics.straggler_tracker`):
  ``timers/<name>-time-max-rank``, a straggler score per rank (time over the other ranks' median)
  and a warning when one rank stays a straggler (:mod:`torchprof_args.shared.stragglers`).

Semantics (log levels 0/1/2 with dummy timers above the level; log options ``max``, ``minmax``,
``all``; ``normalizer``; ``reset``; ``barrier``) follow Megatron's.  The readings themselves
(:class:`TimerSnapshot`) and their Megatron-style report live in
:mod:`~torchprof_args.capture.metrics.timer_snapshot` and are importable from here too.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torchprof_args import _dist
from torchprof_args.capture.metrics.config import TimersConfig
from torchprof_args.capture.metrics.gather import RankGather, Request
from torchprof_args.capture.metrics.sinks import DictLogger, ScalarWriter
from torchprof_args.capture.metrics.straggler_tracker import (
    DEFAULT_STRAGGLER_TIMERS,
    StragglerTracker,
    straggler_figures,
)
from torchprof_args.capture.metrics.timer_kinds import (
    CudaEventTimer,
    DummyTimer,
    EventPool,
    NvtxRanges,
    NvtxTimer,
    SynchronizingTimer,
    Timer,
    group_barrier,
)
from torchprof_args.capture.metrics.timer_snapshot import TimerSnapshot, format_snapshot, timer_scalars
from torchprof_args.errors import TimerError, TimerNamesMismatchError
from torchprof_args.log import get_logger

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["DummyTimer", "Timer", "TimerError", "TimerNamesMismatchError", "TimerSnapshot", "Timers"]

logger = get_logger(__name__)

_MAX_LOG_LEVEL = 2
_LOG_OPTIONS = ("max", "minmax", "all")


def _numeric_figures(per_rank: object) -> dict[str, float]:
    """``per_rank`` as ``{key: float}``: a mapping of numbers (None and non-finite values left out)."""
    if per_rank is None:
        return {}
    if not isinstance(per_rank, Mapping):
        raise TypeError(f"Timers.gather: per_rank must be a mapping of figure names to numbers, got "
                        f"{type(per_rank).__name__}.")
    figures: dict[str, float] = {}
    for key, value in per_rank.items():
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"Timers.gather: per_rank[{key!r}] is {value!r}, not a number.") from None
        if math.isfinite(number):
            figures[str(key)] = number
    return figures


class Timers:
    """A group of named timers, a drop-in for ``megatron.core.timers.Timers``: ``timers(name,
    log_level=None)`` returns the timer (a no-op dummy above the group's level); reading them across
    ranks is one collective per interval (:meth:`gather`).

    Args:
        log_level: 0, 1 or 2 (Megatron's ``--timing-log-level``); ``log_option``: ``max``, ``minmax``
            or ``all``, what the report shows across ranks (others: ValueError, as for ``device``).
        synchronize: Megatron's synchronize-per-start/stop on CUDA; ``device``: ``"auto"`` (CUDA events
            when CUDA is available, else host timers), ``"cuda"`` or ``"cpu"``.
        group: the process group the readings are gathered over (default: the whole world).
        nvtx: with ``range_push(name)`` / ``range_pop()``: every timer is also an NVTX range.
        straggler_threshold, straggler_intervals, straggler_timers: the straggler figures and warning
            (``--straggler-*``; threshold 0 turns the warning off).
    """

    def __init__(
        self,
        log_level: int = TimersConfig.log_level,
        log_option: str = TimersConfig.log_option,
        *,
        synchronize: bool = TimersConfig.synchronize,
        device: str = "auto",
        group: ProcessGroup | None = None,
        nvtx: NvtxRanges | None = None,
        straggler_threshold: float = TimersConfig.straggler_threshold,
        straggler_intervals: int = TimersConfig.straggler_intervals,
        straggler_timers: Sequence[str] = DEFAULT_STRAGGLER_TIMERS,
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
        self._rank_gather = RankGather(group)
        self._straggler_timers = tuple(straggler_timers)
        self.stragglers = StragglerTracker(straggler_threshold, straggler_intervals, rank=_dist.rank())

    @classmethod
    def from_config(cls, config: TimersConfig, **kwargs: Any) -> Timers:
        """Timers as a config says; with ``config.nvtx`` on CUDA every timer is also an NVTX range.

        Args:
            config: the checked :class:`TimersConfig`; ``kwargs``: the constructor's other arguments.

        Returns:
            The timers.
        """
        kwargs.setdefault("straggler_threshold", config.straggler_threshold)
        kwargs.setdefault("straggler_intervals", config.straggler_intervals)
        kwargs.setdefault("straggler_timers", config.straggler_timers)
        timers = cls(config.log_level, config.log_option, synchronize=config.synchronize, **kwargs)
        if config.nvtx and timers.device == "cuda" and timers._nvtx is None:
            from torchprof_args.capture.runtime.nsys import CudaNsysBackend

            timers._nvtx = CudaNsysBackend()
        return timers

    @classmethod
    def from_args(cls, args: argparse.Namespace, **kwargs: Any) -> Timers:
        """Timers configured by ``--timing-log-level``, ``--timing-log-option`` and ``--timing-synchronize``
        (Megatron-LM's own args namespace works too); NVTX ranges with ``--torch-profile-nsys`` on CUDA.

        Args:
            args: the parsed namespace (checked: TorchProfileArgsError); ``kwargs``: as :meth:`from_config`.

        Returns:
            The timers.
        """
        from torchprof_args.capture.config import configs_from_args

        return cls.from_config(configs_from_args(args).timers, **kwargs)

    @staticmethod
    def _resolve_device(device: str) -> str:
        if device == "cpu":
            return "cpu"
        try:
            import torch
        except ImportError:
            torch = None  # type: ignore[assignment]  # torch is optional for host timers
        available = torch is not None and torch.cuda.is_available()
        if device == "cuda" and not available:
            logger.warning("Timers(device='cuda') but CUDA is not available; timing on the host instead.")
        return "cuda" if available else "cpu"

    @property
    def log_level(self) -> int:
        """The group's log level: timers created above it are dummies."""
        return self._log_level

    @property
    def log_option(self) -> str:
        """What the report shows across ranks: ``max``, ``minmax`` or ``all``."""
        return self._log_option

    def names(self) -> list[str]:
        """The names of the timers created on this rank, in creation order."""
        return list(self._timers)

    def _new_timer(self, name: str) -> Timer:
        timer = self._new_device_timer(name)
        # NvtxTimer wraps a Timer with its interface, not a subclass of it
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
        per_rank: Mapping[str, float] | None = None,
    ) -> TimerSnapshot:
        """Read timers on every rank with one collective (every rank must call it).

        The first call with a new list (or new timers, or new figure names) agrees on the layout once
        with an object all-gather; every later interval is one fixed-size float64 all-gather.

        Args:
            names: the same list on every rank, as in Megatron (otherwise every rank raises
                :class:`TimerNamesMismatchError` naming the differences); None: every timer any rank created.
            reset: restart the timers; ``barrier``: a barrier first.
            per_rank: this rank's own figures (``{name: number}``, e.g. memory and profiler figures),
                carried along in the same collective.

        Returns:
            The :class:`~torchprof_args.capture.metrics.timer_snapshot.TimerSnapshot`: every rank's readings
            (seconds, NaN where a rank did not run a timer), figures, global ranks and parallel coordinates.
        """
        union = names is None
        name_list = list(self._timers) if names is None else list(names)
        figures = _numeric_figures(per_rank)
        if barrier:
            group_barrier(self._group)
        local = {
            name: self._timers[name]._elapsed_for_gather(reset) for name in name_list if name in self._timers
        }
        request = Request(tuple(name_list), union, tuple(figures))
        agreement, rows = self._rank_gather.gather(request, local, figures)
        count = len(agreement.names)
        return TimerSnapshot(
            list(agreement.names),
            [row[:count] for row in rows],
            [
                {key: value for key, value in zip(agreement.figures, row[count:], strict=True)
                 if not math.isnan(value)}
                if agreement.figures or per_rank is not None else None
                for row in rows
            ],
            list(agreement.global_ranks),
            list(agreement.coordinates),
        )

    def interval_figures(self, snapshot: TimerSnapshot, normalizer: float, iteration: int
                         ) -> tuple[dict[str, float], dict[str, list[float | None]]]:
        """The figures of one log interval; updates the straggler warning.

        Args:
            snapshot: the interval's :meth:`gather`; ``normalizer``: divides the readings (iterations per
                interval); ``iteration``: where the interval ends.

        Returns:
            The scalars (``timers/<name>-time``, ``-time-min``, ``-time-max-rank``,
            ``stragglers/<name>-score-max``, ``-score-max-rank``) and the per-rank series
            (``stragglers/<name>-score``).
        """
        scalars = timer_scalars(snapshot.min_max(normalizer), self._log_option)
        times = [[t / normalizer for t in row] for row in snapshot.times]
        ranks = snapshot.global_ranks or list(range(len(times)))
        extra, per_rank = straggler_figures(snapshot.names, times, ranks, self._straggler_timers)
        scalars.update(extra)
        self.stragglers.update(iteration, snapshot.names, times, per_rank, ranks, snapshot.coordinates,
                               hardware=snapshot.per_rank)
        return scalars, per_rank

    def _get_elapsed_time_all_ranks(
        self, names: Sequence[str], reset: bool, barrier: bool
    ) -> list[list[float]]:
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
        """Megatron's report text (every rank must call it: it gathers).

        Args:
            names, reset, barrier: as :meth:`gather` takes them; ``normalizer``: divides the readings (> 0).

        Returns:
            The text (milliseconds, across ranks as the log option says); None when nothing ran.
        """
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
        """Log the report (ms) on one rank (every rank must call it: it gathers).

        Args:
            names, reset, barrier: as :meth:`gather`; ``normalizer`` as :meth:`get_all_timers_string`;
                ``rank``: the one that logs (default: the last).

        Returns:
            The text on the logging rank; None elsewhere, or when nothing ran.
        """
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
        writer: ScalarWriter | DictLogger | None,
        iteration: int,
        normalizer: float = 1.0,
        reset: bool = True,
        barrier: bool = False,
    ) -> dict[str, float]:
        """Write the timers' scalars (every rank must call it: it gathers).

        ``timers/<name>-time`` is the maximum across ranks (seconds / ``normalizer``); with log option
        ``minmax`` or ``all`` the minimum goes to ``timers/<name>-time-min`` too; with several ranks, the
        slowest rank to ``timers/<name>-time-max-rank`` and the straggler scores' maximum to
        ``stragglers/<name>-score-max`` (:meth:`interval_figures`).

        Args:
            names, reset, barrier: as :meth:`gather`; ``normalizer``: divides the readings (> 0).
            writer: anything with ``add_scalar(tag, value, step)`` (a ``SummaryWriter``,
                :class:`torchprof_args.MetricsWriter`), wandb or a run (``log(dict, step=)``), or None.
            iteration: the step the scalars are written at.

        Returns:
            The scalars written.
        """
        if not normalizer > 0.0:
            raise ValueError(f"normalizer must be > 0, got {normalizer}.")
        snapshot = self.gather(names, reset=reset, barrier=barrier)
        scalars, _ = self.interval_figures(snapshot, normalizer, iteration)
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
