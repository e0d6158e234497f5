"""A CPU-time limit on an analysis: the exporter's and the publisher's analyses never hold a job's exit.

The limits count this process's CPU time, not the clock: a publisher at idle priority that training
keeps off the CPU is not cut short for waiting, and what is bounded is what an analysis costs the
node.  :func:`time_limit` raises :class:`TimeLimitExceeded` in the block once it has used its seconds
of CPU, by ``SIGPROF`` (``ITIMER_PROF``), where this process owns that signal: the main thread of a
process this package started (the forked exporter, a publisher, a fork server's worker), with
``SIGPROF`` at its default action.  Anywhere else (a publication on a trainer's own thread) it
interrupts nothing, and the caller checks :meth:`Deadline.passed` between its steps instead.
:class:`TimeLimitExceeded` is a ``BaseException``: ``except Exception`` around one analysis cannot
swallow the limit of all of them.
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


def _owns_the_signal() -> bool:
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGPROF) in (signal.SIG_DFL, None))


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`TimeLimitExceeded` in the block once it has used ``seconds`` of this process's
    CPU (None: no limit), where this process owns ``SIGPROF`` (see the module); elsewhere the block
    runs to its end.

    Args:
        seconds: the limit; 0 or less raises at once.
    """
    if seconds is None or not _owns_the_signal():
        yield
        return
    if seconds <= 0:
        raise TimeLimitExceeded

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
