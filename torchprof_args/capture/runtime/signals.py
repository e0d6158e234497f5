"""SIGTERM while profiling: recorded at once, acted on at a safe point, then delivered as before.

Python runs a signal handler between two bytecodes of the main thread, wherever that thread is:
inside torch.profiler's state transition, an inline export, logging's after-fork hook.  Raising
``SystemExit`` there leaves torch.profiler half-way (``stop()`` then segfaults) or is swallowed.
So the handler only records the signal.  The profiler acts at a safe point: in the handler itself
when the main thread is outside the profiler and the signal would end the process (then nothing of
torch is touched), else at the end of the ``step()`` or flush it is in (the next ``step()`` when an
application handler is to run, so that torch.profiler is stopped properly first).  It stops
recording, gives pending publishers what is left of ``--torch-profile-term-grace``, stops the rest
(their partial files removed), then
:meth:`SigtermGuard.deliver` puts the previous disposition back and sends SIGTERM again: the
process ends by SIGTERM as it would have without the profiler, or the application's own handler
runs (e.g. Megatron-LM's checkpoint-and-exit handler).  An application that ignores SIGTERM is
left alone: no handler is installed.

A rank blocked in C (a hung collective, a long barrier) reaches no safe point and does not even
run the Python handler.  So a watchdog thread, woken by the signal's wakeup fd (written by the
C-level handler at once; an application's own wakeup fd keeps receiving every byte), enforces the
grace: at its end it stops the publishers, removes staging and partial files and, when the
previous action was the default, ends the process by SIGTERM.

Hooks: ``hooks`` callables run on the main thread at the safe point, before the clean-up (e.g.
a flight-recorder dump).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from torchprof_args.log import get_logger

__all__ = ["SignalHandler", "SigtermGuard", "SigtermWatcher", "terminate"]

#: A Python signal handler, as ``signal.signal`` takes it.
SignalHandler = Callable[[int, FrameType | None], object]
#: What ``signal.getsignal`` returns: a handler, ``SIG_DFL``/``SIG_IGN``, or None (set outside Python).
_Disposition = SignalHandler | int | signal.Handlers | None

logger = get_logger(__name__)


class SigtermGuard:
    """Records SIGTERM for the profiler; see the module docstring.

    ``install(on_signal, emergency)``: ``on_signal()`` runs inside the handler (it must only set
    flags); ``emergency()`` runs on the watchdog thread when no safe point came within the grace.
    ``hooks`` run at the safe point; ``on_arrival`` run on the watchdog thread as soon as SIGTERM
    arrives, even while the main thread is blocked in C code (the flight recorder dumps there).
    """

    def __init__(self, rank: int, grace: float) -> None:
        self.rank = rank
        self.grace = grace
        self.pending = False
        self.received_at: float | None = None
        self.hooks: list[Callable[[], None]] = []
        self.on_arrival: list[Callable[[], None]] = []
        self._previous: _Disposition = None
        self._on_signal: Callable[[], None] | None = None
        self._emergency: Callable[[], None] | None = None
        self._done = threading.Event()
        self._watchdog: _Watchdog | None = None

    @property
    def installed(self) -> bool:
        return self._previous is not None

    @property
    def default_action(self) -> bool:
        """SIGTERM would end the process without the profiler (no application handler)."""
        return self._previous == signal.SIG_DFL

    @property
    def deadline(self) -> float:
        """When the grace period ends (monotonic); infinity while no SIGTERM was received."""
        return float("inf") if self.received_at is None else self.received_at + self.grace

    def install(self, on_signal: Callable[[], None], emergency: Callable[[], None]) -> None:
        """Take over SIGTERM (main thread only; left alone when the application ignores it)."""
        if threading.current_thread() is not threading.main_thread() or self.installed:
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None or previous == signal.SIG_IGN:
            return  # ignored, or a handler installed outside Python that could not be put back
        self._previous, self._on_signal, self._emergency = previous, on_signal, emergency
        signal.signal(signal.SIGTERM, self._handler)
        try:
            self._watchdog = _Watchdog(self)
        except (OSError, ValueError) as err:
            logger.warning("rank %d: no SIGTERM watchdog (%s): a rank blocked in C code then ends by SIGTERM "
                           "only at its next step", self.rank, err)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.pending:
            return
        self.received_at = time.monotonic()
        self.pending = True
        if self._on_signal is not None:
            self._on_signal()

    def run_hooks(self, hooks: list[Callable[[], None]] | None = None) -> None:
        """Run ``hooks`` (default: the safe-point hooks), logging any failure with the rank."""
        for hook in list(self.hooks if hooks is None else hooks):
            try:
                hook()
            except Exception as err:  # noqa: BLE001
                logger.error("rank %d: SIGTERM hook %r failed: %s", self.rank, hook, err)

    def restore(self) -> None:
        """Put the previous disposition back (main thread; a normal stop)."""
        self._done.set()
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == self._handler:  # not if the application replaced it since
                signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def deliver(self) -> None:
        """After the clean-up: restore the previous disposition and send SIGTERM to this process again."""
        previous = self._previous
        self.restore()
        logger.warning("rank %d: profiling cleaned up %.1f s after SIGTERM; delivering it to the %s",
                       self.rank, time.monotonic() - (self.received_at or time.monotonic()),
                       "default action" if previous == signal.SIG_DFL else "application's handler")
        _flush_streams()
        os.kill(os.getpid(), signal.SIGTERM)
        if previous == signal.SIG_DFL:
            time.sleep(5.0)  # the default action ends the process; this is never reached
            os._exit(128 + signal.SIGTERM)

    def _expired(self) -> None:
        """Watchdog thread: the grace ended and the main thread reached no safe point."""
        if self._done.is_set():
            return
        logger.error("rank %d: no safe point within --torch-profile-term-grace (%.0f s) after SIGTERM (the "
                     "main thread is blocked); stopping publishers and removing partial files from this "
                     "thread", self.rank, self.grace)
        if self._emergency is not None:
            try:
                self._emergency()
            except Exception as err:  # noqa: BLE001
                logger.error("rank %d: emergency clean-up failed: %s", self.rank, err)
        if self._previous == signal.SIG_DFL and not self._done.is_set():
            _die_by_sigterm()
        logger.warning("rank %d: the application's SIGTERM handler runs when the main thread returns to "
                       "Python", self.rank)


class _Watchdog:
    """A thread that learns of SIGTERM from the wakeup fd and starts the grace timer."""

    def __init__(self, guard: SigtermGuard) -> None:
        self._guard = guard
        self._read, self._write = os.pipe()
        self._stop_read, self._stop_write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        try:
            self._old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            self._close_fds()
            raise
        self._timer: threading.Timer | None = None
        self._thread = threading.Thread(target=self._run, name="torchprof-sigterm-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self._read, self._stop_read], [], [])
            if self._stop_read in ready:
                return
            with contextlib.suppress(BlockingIOError):
                data = os.read(self._read, 512)
                if self._old_fd >= 0:
                    with contextlib.suppress(OSError):
                        os.write(self._old_fd, data)  # the application's own wakeup fd sees every signal
                if signal.SIGTERM in data and self._timer is None:
                    self._timer = threading.Timer(self._guard.grace, self._guard._expired)
                    self._timer.daemon = True
                    self._timer.start()
                    self._guard.run_hooks(self._guard.on_arrival)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._stop_write, b"x")
        self._thread.join(timeout=2.0)
        if self._timer is not None:
            self._timer.cancel()
        with contextlib.suppress(ValueError, OSError):
            current = signal.set_wakeup_fd(self._old_fd)
            if current not in (self._write, -1):
                signal.set_wakeup_fd(current)  # someone replaced ours since: keep theirs
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in (self._read, self._write, self._stop_read, self._stop_write):
            with contextlib.suppress(OSError):
                os.close(fd)


class SigtermWatcher:
    """Without a :class:`SigtermGuard` (nothing profiled): calls ``on_sigterm`` from a thread as
    soon as SIGTERM arrives (main thread blocked or not).

    Without a Python-level SIGTERM handler there is no wakeup: then ``handler`` is installed (the
    recorder's: dump, then terminate as SIGTERM's default action would).
    """

    def __init__(self, on_sigterm: Callable[[], object], handler: SignalHandler) -> None:
        self._on_sigterm = on_sigterm
        self._handler = handler
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._installed_handler: SignalHandler | None = None

    def start(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGTERM)
        if current == signal.SIG_IGN:
            return False
        if current in (signal.SIG_DFL, None):  # the C-level handler (and its wakeup) needs a Python one
            self._installed_handler = self._handler
            signal.signal(signal.SIGTERM, self._handler)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if previous != -1:  # someone else (asyncio) owns the wakeup fd: leave it to them
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return False
        self._pair = (reader, writer)
        threading.Thread(target=self._loop, args=(reader,), name="torchprof-hang-sigterm",
                         daemon=True).start()
        return True

    def _loop(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                logger.debug("SIGTERM seen by the hang forensics' watcher thread")
                self._on_sigterm()

    def stop(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._pair is not None:
            signal.set_wakeup_fd(-1)
            reader, writer = self._pair
            for sock in (writer, reader):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._pair = None
        handler = self._installed_handler
        if handler is not None and signal.getsignal(signal.SIGTERM) == handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._installed_handler = None


def terminate(signum: int) -> None:
    """What SIGTERM would have done without a handler."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _die_by_sigterm() -> None:
    """From a thread that is not the main one: default action for SIGTERM at the C level, then SIGTERM."""
    _flush_streams()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signal.SIGTERM, 0)  # SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5.0)
    finally:
        os._exit(128 + signal.SIGTERM)
