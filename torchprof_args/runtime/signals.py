"""SIGTERM while profiling: pending traces are finished (bounded) before the process exits.

The handler unwinds the main thread with ``SystemExit`` (or calls the application's own
handler), so ``TorchProfiler``'s context exit runs and waits for its publishers.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from torchprof_args.log import get_logger

__all__ = ["SigtermGuard"]

logger = get_logger(__name__)


class SigtermGuard:
    """Installs the handler on :meth:`install` (main thread only); :meth:`restore` puts the old one back."""

    def __init__(self, rank: int, on_signal: Any = None) -> None:
        self.rank = rank
        self._previous: Any = None
        #: Called first in the handler (the flight recorder dumps there).
        self.on_signal = on_signal

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        self._previous = previous
        rank, on_signal = self.rank, self.on_signal

        def on_sigterm(signum: int, frame: Any) -> None:
            if on_signal is not None:
                on_signal()
            logger.warning("rank %d: SIGTERM received; finishing pending traces before exit", rank)
            if callable(previous):
                previous(signum, frame)  # the application's own handler decides how to exit
            elif previous != signal.SIG_IGN:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)

    def restore(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
