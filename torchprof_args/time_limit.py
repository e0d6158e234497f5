"""A CPU-time limit on an analysis: the exporter's and the publisher's analyses never hold a job's exit.

The limits count this process's CPU time, not the clock: a publisher at idle priority that training
keeps off the CPU is not cut short for waiting, and what is bounded is what an analysis costs the
node.  :func:`time_limit` raises :class:`TimeLimitExceeded` in the block once it has used its seconds
of CPU, by ``SIGPROF`` (``ITIMER_PROF``), or optionally once a wall-clock backstop has passed
(``SIGALRM``, ``ITIMER_REAL``: for a block that could wait rather than work), where this process owns
those signals: the main thread of a process this package started (the forked exporter, the rank's
publisher), with the signals at their default action.  Anywhere else (another thread, a process
whose handlers are its own) it interrupts nothing, and the caller checks :meth:`Deadline.passed`
between its steps instead.  :class:`TimeLimitExceeded` is a ``BaseException``: ``except Exception`` around
one analysis cannot swallow the limit of all of them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

__all__ = ["Deadline", "TimeLimitExceeded", "time_limit"]


class TimeLimitExceeded(BaseException):  # noqa: N818 - it is a limit reached, not an error
    """The block ran past its time limit."""


class Deadline:
    """The CPU time (this process's) a sequence of analyses must stay within.

    Args:
        seconds: CPU seconds from now; None: none (never passed).
        what: what the limit is, for the messages of what did not fit.
    """

    def __init__(self, seconds: float | None, what: str = "the time limit") -> None:
        self.seconds = seconds
        self.what = what
        self.at = None if seconds is None else time.process_time() + seconds

    def left(self) -> float | None:
        """CPU seconds left (never below 0); None without a deadline."""
        return None if self.at is None else max(0.0, self.at - time.process_time())

    def passed(self) -> bool:
        """Whether the CPU time is spent."""
        return self.at is not None and time.process_time() >= self.at

    def spend(self) -> None:
        """Take the time as spent now: a :func:`time_limit` for what was left has fired (the kernel's
        interval timer counts in clock ticks, so it can fire a few ms before :meth:`passed`)."""
        self.at = time.process_time()


def _owns(signum: int) -> bool:
    return signal.getsignal(signum) in (signal.SIG_DFL, None)


@contextlib.contextmanager
def time_limit(seconds: float | None, wall: float | None = None) -> Iterator[None]:
    """Raise :class:`TimeLimitExceeded` in the block once it has used ``seconds`` of this process's
    CPU (None: no limit), or, with ``wall``, once that many seconds have passed on the clock (a
    backstop for a block that waits rather than works), where this process owns ``SIGPROF`` (and
    ``SIGALRM``; see the module); elsewhere the block runs to its end.

    Args:
        seconds: the CPU limit; 0 or less raises at once.
        wall: the clock's limit, or None.
    """
    timers: list[tuple[int, int, float]] = [
        (signum, which, limit) for signum, which, limit in
        ((signal.SIGPROF, signal.ITIMER_PROF, seconds), (signal.SIGALRM, signal.ITIMER_REAL, wall))
        if limit is not None]
    if not timers or threading.current_thread() is not threading.main_thread() \
            or not all(_owns(signum) for signum, _, _ in timers):
        yield
        return
    if min(limit for _, _, limit in timers) <= 0:
        raise TimeLimitExceeded

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded

    previous = [(signum, signal.signal(signum, expire)) for signum, _, _ in timers]
    for _, which, limit in timers:
        signal.setitimer(which, limit)
    try:
        yield
    finally:
        for _, which, _ in timers:
            signal.setitimer(which, 0)
        for signum, handler in previous:
            signal.signal(signum, handler)
