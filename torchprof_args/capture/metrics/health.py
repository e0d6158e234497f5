"""The allocation-retry warning: ``num_alloc_retries`` growing on a rank, a classic cause of slow steps.

When cudaMalloc fails, PyTorch's caching allocator frees its whole cache and retries; the step
that pays for it stalls (synchronising every stream).  Every rank sees every rank's cumulative
``memory/alloc-retries`` after the interval's one gather; global rank 0 warns once per episode
(intervals in a row in which some rank's count grew), naming the ranks and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torchprof_args.log import get_logger

__all__ = ["AllocRetryWatch"]

logger = get_logger(__name__)

KEY = "memory/alloc-retries"


class AllocRetryWatch:
    """Tracks every rank's allocation retries across log intervals; :meth:`update` returns the
    warning of an episode's first interval (logged on ``rank`` 0 only)."""

    def __init__(self, *, rank: int) -> None:
        self.rank = rank
        self._previous: dict[int, float] = {}
        self._in_episode = False
        self._last_iteration: int | None = None
        #: Warnings issued so far (every rank computes them).
        self.warnings: list[str] = []

    def update(self, iteration: int, per_rank: Sequence[Mapping[str, float] | None],
               global_ranks: Sequence[int] | None = None) -> str | None:
        ranks = list(global_ranks) if global_ranks else list(range(len(per_rank)))
        grown: list[tuple[int, float, float]] = []
        for index, figures in enumerate(per_rank):
            value = (figures or {}).get(KEY)
            if value is None:
                continue
            rank = ranks[index]
            before = self._previous.get(rank)
            if before is not None and value > before:
                grown.append((rank, before, value))
            self._previous[rank] = value
        since = self._last_iteration
        self._last_iteration = iteration
        if not grown:
            self._in_episode = False
            return None
        if self._in_episode:
            return None
        self._in_episode = True
        shown = ", ".join(f"rank {rank} {after - before:.0f} (total {after:.0f})"
                          for rank, before, after in grown[:4])
        more = f" and {len(grown) - 4} more ranks" if len(grown) > 4 else ""
        window = f"iterations {since}-{iteration}" if since is not None else f"the interval to {iteration}"
        message = (f"CUDA allocator retries grew in {window}: {shown}{more}. Each retry frees the "
                   "allocator's cache and stalls the step; lower the peak memory (micro-batch size, "
                   "activation recomputation) or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. "
                   "Not repeated until an interval without retries.")
        self.warnings.append(message)
        if self.rank == 0:
            logger.warning(message)
        return message
