"""A time limit on an analysis: the exporter's and the publisher's analyses never hold a job's exit.

:func:`time_limit` raises :class:`TimeLimitExceeded` in the block once its seconds have passed, by
``SIGALRM``, where this process owns that signal: the main thread of a process this package started
(the forked exporter, a publisher, a fork server's worker), with ``SIGALRM`` at its default action.
Anywhere else (a publication on a trainer's own thread) it interrupts nothing, and the caller checks
:meth:`Deadline.passed` between its steps instead.  :class:`TimeLimitExceeded` is a
``BaseException``: ``except Exception`` around one analysis cannot swallow the limit of all of them.
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
    """A point in time (monotonic) that a sequence of analyses must not pass.

    Args:
        seconds: from now; None: none (never passed).
        what: what the limit is, for the messages of what did not fit.
    """

    def __init__(self, seconds: float | None, what: str = "the time limit") -> None:
        self.seconds = seconds
        self.what = what
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        """Seconds until the deadline (never below 0); None without one."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        """Whether the deadline has passed."""
        return self.at is not None and time.monotonic() >= self.at


def _owns_alarm() -> bool:
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None))


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`TimeLimitExceeded` in the block after ``seconds`` (None: no limit), where this
    process owns ``SIGALRM`` (see the module); elsewhere the block runs to its end.

    Args:
        seconds: the limit; 0 or less raises at once.
    """
    if seconds is None or not _owns_alarm():
        yield
        return
    if seconds <= 0:
        raise TimeLimitExceeded

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitExceeded

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
