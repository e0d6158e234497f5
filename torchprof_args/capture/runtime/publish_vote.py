"""The publishing vote: bounded publishers and rank 0's one line per cycle, without a new per-step
collective.

Two steps before each window every rank posts, asynchronously on the fence group, one row of
:data:`~torchprof_args.capture.runtime.export.progress.ROW_FIELDS` (its publications in flight and its
running totals) and whether it still flushes a window before that one; every rank collects the same rows
at the step before the window.  When a rank has ``--torch-profile-max-publishing`` traces in
flight, that window is skipped on every rank (:meth:`Timeline.skip_window`: nothing recorded, no
flush, no fence), so a rank never holds more than N staged traces; rank 0
warns when skipping begins and says when publishing caught up.  Rank 0 also turns the rows into
one line: the traces every rank published since the last line (count, size, the slowest
publisher, failures).  At exit the rows are gathered once more, after the exit fence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from torchprof_args.capture.runtime.export.progress import ROW_FIELDS
from torchprof_args.capture.runtime.fence import Fence
from torchprof_args.capture.runtime.timeline import Timeline
from torchprof_args.log import get_logger
from torchprof_args.naming import cycle_dir_name

if TYPE_CHECKING:
    from torchprof_args.capture.runtime.export.writer import TraceWriter

__all__ = ["PublishingVote", "progress_row"]

logger = get_logger(__name__)

KIND = "publishing"
_FIELD = {name: index for index, name in enumerate(ROW_FIELDS)}
#: After the progress row: 1 when the rank flushes a window between the vote and the next window.
_FLUSH_DUE = len(ROW_FIELDS)


def progress_row(writer: TraceWriter | None) -> list[int]:
    """A rank's row for the vote: its writer's publications in flight and totals (zeros without one)."""
    return writer.progress.row(writer.in_flight) if writer is not None else [0] * len(ROW_FIELDS)


class PublishingVote:
    """Posts and collects the publishing vote around each window; see the module docstring.

    ``read_row()`` (given to :meth:`post`): this rank's row, :func:`progress_row` of its writer.
    """

    def __init__(self, limit: int, fence: Fence, *, rank: int) -> None:
        self.limit = limit
        self.fence = fence
        self.rank = rank
        self.skipped = 0
        #: Windows skipped in a row (rank 0 warns at the first, says when publishing caught up).
        self._streak = 0
        self._reported: list[list[int]] | None = None

    def post(self, iteration: int, timeline: Timeline, read_row: Callable[[], list[int]]) -> None:
        """After the step ending ``iteration``: post this rank's ``read_row()`` when a window
        begins at ``iteration + 2``, with whether it still flushes at ``iteration + 1``."""
        if not timeline.window_starts(iteration + 2):
            return
        row = read_row()  # read (and the slowest-publication period restarted) only when posted
        flush_due = int(timeline.local_action(iteration + 1).name == "RECORD_AND_SAVE")
        self.fence.post_vote([*row, flush_due], kind=KIND)

    def decide(self, iteration: int, timeline: Timeline) -> str | None:
        """Before the step ending ``iteration`` is executed: collect the rows (the same on every rank),
        report on rank 0, and skip the window beginning at ``iteration + 1`` when publishing is behind.

        Returns why the window was skipped (one sentence, the same on every rank), else None."""
        if not self.fence.pending(KIND):
            return None
        rows = self.fence.collect_rows(kind=KIND)
        if not rows:
            return None
        self.report(rows)
        behind = max(row[_FIELD["in_flight"]] + row[_FLUSH_DUE] for row in rows)
        if not timeline.window_starts(iteration + 1):
            return None
        if self.limit <= 0 or behind < self.limit:
            self._caught_up(iteration + 1)
            return None
        last = timeline.skip_window(iteration + 1)
        self.skipped += 1
        self._streak += 1
        slowest = max(range(len(rows)), key=lambda r: rows[r][_FIELD["in_flight"]] + rows[r][_FLUSH_DUE])
        reason = (f"publishing is behind: rank {slowest} has {behind} trace(s) in flight (--torch-profile-"
                  f"max-publishing {self.limit})")
        if self.rank == 0:  # once when publishing falls behind; the rest of the streak at DEBUG
            logger.log(logging.WARNING if self._streak == 1 else logging.DEBUG,
                       "rank 0: %s; skipping the window of iterations %d..%d on every rank "
                       "(%d skipped so far)", reason, iteration + 1, last, self.skipped)
        return reason

    def _caught_up(self, first: int) -> None:
        """A window records again after ``self._streak`` skipped ones: rank 0 says so once."""
        if self._streak and self.rank == 0:
            logger.info("rank 0: publishing caught up; the window beginning at iteration %d records (%d "
                        "window(s) skipped in a row, %d in all)", first, self._streak, self.skipped)
        self._streak = 0

    def abandon(self) -> None:
        """Collect a vote still in flight (leaving; every rank posted it)."""
        if self.fence.pending(KIND):
            self.fence.collect_rows(timeout=5.0, kind=KIND)

    def final(self, row: list[int]) -> None:
        """At exit, after the exit fence (every rank is there): one last gather and line (blocking)."""
        self.fence.post_vote([*row, 0], kind=KIND)
        rows = self.fence.collect_rows(timeout=30.0, kind=KIND)
        if rows:
            self.report(rows, final=True)

    def report(self, rows: list[list[int]], final: bool = False) -> None:
        """Rank 0: one line on what every rank published since the previous line."""
        previous, self._reported = self._reported, rows
        if self.rank != 0:
            return
        previous = previous or [[0] * len(row) for row in rows]
        new = [[now - before for now, before in zip(row, old, strict=True)]
               for row, old in zip(rows, previous, strict=True)]
        published = _total(new, "published")
        failed_ranks = [rank for rank, row in enumerate(new) if row[_FIELD["failed"]] > 0]
        if not published and not failed_ranks:
            return
        slowest = max(range(len(rows)), key=lambda r: rows[r][_FIELD["slowest_ms"]])
        cycle = max((row[_FIELD["cycle_first"]], row[_FIELD["cycle_last"]]) for row in rows)
        in_flight = _total(rows, "in_flight")
        failures = "none failed"
        if failed_ranks:
            failures = f"{_total(new, 'failed')} failed (rank(s) {_named(failed_ranks)}: see their errors)"
        no_summary = [rank for rank, row in enumerate(new) if row[_FIELD["summary_failed"]] > 0]
        if no_summary:
            failures += (f"; {_total(new, 'summary_failed')} published without their summary sidecar "
                         f"(rank(s) {_named(no_summary)}: see their warnings; the tools parse those traces)")
        log = logger.warning if failed_ranks or no_summary else logger.info
        log("rank 0: %s%d trace(s) published up to %s (%.1f MB), slowest publisher rank %d (%.1f s), %s%s",
            "at exit: " if final else "", published, cycle_dir_name(*cycle), _total(new, "kbytes") / 1000,
            slowest, rows[slowest][_FIELD["slowest_ms"]] / 1000, failures,
            f"; {in_flight} in flight" if in_flight and not final else "")


def _named(ranks: list[int]) -> str:
    """At most 8 ranks, then ``...``."""
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")


def _total(rows: list[list[int]], field: str) -> int:
    return sum(row[_FIELD[field]] for row in rows)
