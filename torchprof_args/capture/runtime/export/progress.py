"""One rank's running totals of its publications, read once per window by the publishing vote.

The publications thread adds each outcome; the training thread reads a fixed-length row of integers
(:meth:`PublishProgress.row`) that travels to rank 0 in the vote taken before each window
(:mod:`torchprof_args.capture.runtime.publish_vote`): the backpressure decision and rank 0's one line per
cycle need nothing else, so no collective is added per trace or per step.
"""

from __future__ import annotations

import threading

from torchprof_args.naming import cycle_of_name

__all__ = ["ROW_FIELDS", "PublishProgress"]

#: The row's fields, in order (integers >= 0: the vote is an all-reduce MAX of per-rank rows).
ROW_FIELDS = ("in_flight", "published", "kbytes", "failed", "slowest_ms", "cycle_first", "cycle_last",
              "summary_failed")


class PublishProgress:
    """Totals since the start (published, kilobytes, failed, published without their summary sidecar),
    the slowest publication since the last row, and the last cycle a trace of this rank was published
    for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.published = 0
        self.kbytes = 0
        self.failed = 0
        self.summary_failed = 0
        self._slowest_ms = 0
        self._cycle = (0, 0)

    def add(self, trace_path: str, *, ok: bool, megabytes: float = 0.0, seconds: float = 0.0,
            summary_failed: bool = False) -> None:
        """Count one outcome (``trace_path``'s cycle folder names its iterations; ``summary_failed``: the
        trace is published, its summary sidecar is not)."""
        cycle = cycle_of_name(_folder(trace_path), folder=True)
        with self._lock:
            if not ok:
                self.failed += 1
                return
            self.published += 1
            self.summary_failed += summary_failed
            self.kbytes += int(megabytes * 1000)
            self._slowest_ms = max(self._slowest_ms, int(seconds * 1000))
            if cycle is not None:
                self._cycle = max(self._cycle, cycle)

    def row(self, in_flight: int) -> list[int]:
        """This rank's row of :data:`ROW_FIELDS`; starts the next slowest-publication period."""
        with self._lock:
            slowest, self._slowest_ms = self._slowest_ms, 0
            return [in_flight, self.published, self.kbytes, self.failed, slowest, *self._cycle,
                    self.summary_failed]


def _folder(trace_path: str) -> str:
    parts = trace_path.replace("\\", "/").rsplit("/", 2)
    return parts[-2] if len(parts) >= 2 else ""
