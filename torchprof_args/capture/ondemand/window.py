"""The window every rank agrees on: warm up from ``warmup_start``, record ``[start, end)``.

Data only: what the window means for each iteration's profiler action is the timeline's business
(:mod:`torchprof_args.capture.runtime.timeline`), which sits above this package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torchprof_args.capture.ondemand.protocol import RequestRejected, TraceRequest

__all__ = ["MAX_DEFER_ITERATIONS", "OnDemandWindow", "place_window", "ranks_text"]

#: An accepted window may be pushed back past a scheduled cycle by at most this many iterations.
MAX_DEFER_ITERATIONS = 10_000


@dataclasses.dataclass(frozen=True)
class OnDemandWindow:
    """An accepted request: warm up from ``warmup_start``, record global iterations ``[start, end)``."""

    request_id: str
    check_iteration: int
    warmup_start: int
    start: int
    end: int
    ranks: tuple[int, ...] | None  # None: every rank

    def traces(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


def place_window(request: TraceRequest, iteration: int, warmup: int,
                 busy: Callable[[int], bool] | None) -> OnDemandWindow:
    """The window for ``request`` checked at ``iteration``: the earliest that avoids scheduled work.

    ``busy(i)`` says whether the schedule uses iteration ``i``; raises :class:`RequestRejected` when
    no gap is found within :data:`MAX_DEFER_ITERATIONS`.
    """
    length = warmup + request.iterations
    warmup_start = iteration + 1
    limit = iteration + 1 + MAX_DEFER_ITERATIONS
    while busy is not None:
        clash = next((i for i in range(warmup_start, warmup_start + length) if busy(i)), None)
        if clash is None:
            break
        while busy(clash) and clash <= limit:
            clash += 1
        warmup_start = clash
        if warmup_start > limit:
            raise RequestRejected(
                f"the scheduled --torch-profile cycles leave no gap of {length} iterations in the next "
                f"{MAX_DEFER_ITERATIONS}; ask for fewer iterations or retry later")
    start = warmup_start + warmup
    return OnDemandWindow(request.request_id, iteration, warmup_start, start, start + request.iterations,
                          request.ranks)


def ranks_text(ranks: tuple[int, ...] | None) -> str:
    return "all" if ranks is None else " ".join(map(str, ranks))
