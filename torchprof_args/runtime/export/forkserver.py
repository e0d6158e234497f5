"""The publisher's fork server: one process per traced rank that imports the publisher's code once and
forks a worker per trace.

A publisher started per trace spends most of its CPU time before it publishes: starting Python and
importing numpy, msgspec and the analysis (about 0.2 s of a 0.3 s publication of a 6.5 MB trace on
benchmarks/bench_window_cost.py), and that CPU time is what slows the steps after a flush.  The fork
server is started with the writer (``--torch-profile-publisher-server``, at the publishers' priority),
imports once while training starts, then forks a worker per trace: the worker runs the publisher
(:func:`~torchprof_args.runtime.export.publisher.run_job`: the job's checks, compression, summary,
status) in a copy of an interpreter that has imported everything, and exits.  The forked exporter
(:mod:`~torchprof_args.runtime.export.child`) then only exports and exits.

Messages on a ``SOCK_SEQPACKET`` socket pair, one per datagram::

    server -> training process   b"ready"                      imports done
    training process -> server   b"job <path>" + [status fd]   publish the job file <path>
    server -> training process   b"started <pid>" + [pidfd]    its worker (a pidfd where the platform has one)
                                 b"failed <reason>"            no worker (the fork failed)
    server -> training process   b"exited <pid> <code> <cpu>"  a worker ended (os.waitstatus_to_exitcode;
                                                               its CPU seconds)

The server exits when the training process's end of the socket closes (the writer closed, or the
training process died); workers still running finish their trace, as publishers always did.
Started as ``python -m torchprof_args.runtime.export.forkserver --control-fd N --staging DIR --output
DIR --priority P``; the staging and output directories bound every job, as the publisher's own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from torchprof_args.runtime.export.job import EXIT_PUBLISH_FAILED
from torchprof_args.runtime.export.priority import IDLE, NORMAL, PRIORITIES, lower_to_background
from torchprof_args.runtime.export.staging import pid_alive

__all__ = ["ForkServer", "ForkServerError", "Worker", "forkserver_argv", "main"]

_MESSAGE_BYTES = 8192
#: Modules a worker needs, imported by the server before it says it is ready.
PRELOAD = (
    "torchprof_args.runtime.export.publisher",
    "torchprof_args.analysis.staged",
)


class ForkServerError(OSError):
    """The fork server cannot start a worker (it died, or the fork failed there).

    ``sent``: whether the job reached the server.  When it did not, another publisher may take the
    job; when it did, none may (a worker may have started before the server died), and the trace fails.
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


# -- the server -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Serve the training process on ``--control-fd`` until it closes its end."""
    parser = argparse.ArgumentParser(prog="python -m torchprof_args.runtime.export.forkserver",
                                     description="The publisher's fork server (started by TorchProfiler).")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--staging", action="append", required=True, help="a staging directory (repeatable)")
    parser.add_argument("--output", required=True, help="the output directory")
    parser.add_argument("--priority", choices=PRIORITIES, default=NORMAL)
    args = parser.parse_args(argv)
    if args.priority == IDLE:
        lower_to_background()  # inherited by every worker
    control = socket.socket(fileno=args.control_fd)
    for name in PRELOAD:
        __import__(name)
    _warm_up()
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select through the wakeup fd
    with contextlib.suppress(OSError):
        control.send(b"ready")
    _serve(control, wakeup_read, args.staging, args.output)
    return 0


#: A tiny trace with what the publisher decodes (operators with shapes, a gloo collective, the
#: allocator's counters, a step), for :func:`_warm_up`.
_WARM_UP_TRACE = b"""{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [
{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 1, "dur": 10,
 "args": {"Input Dims": [[64, 128], [128, 128], [128]], "Input type": ["float", "float", "float"]}},
{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 2, "dur": 5,
 "args": {"Input Dims": [[64, 128], [128, 128]], "Input type": ["float", "float"]}},
{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 20, "dur": 30,
 "args": {"Input Dims": [[660480]], "Input type": ["float"]}},
{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3, "s": "t",
 "args": {"Total Allocated": 1024, "Total Reserved": 2048, "Device Type": 0, "Device Id": -1}}
], "traceName": "warm-up"}"""


def _warm_up() -> None:
    """Summarise a tiny trace once: what the first use of the decoders, numpy and the analysis costs
    (about 10 ms of each worker's CPU) is paid here, once, and the workers inherit it.  Best effort."""
    import tempfile

    from torchprof_args.analysis.staged import summarise_trace

    with contextlib.suppress(Exception), tempfile.TemporaryDirectory(prefix="torchprof-warm-up-") as folder:
        trace = os.path.join(folder, "warm-up.pt.trace.json")
        with open(trace, "wb") as handle:
            handle.write(_WARM_UP_TRACE)
        summarise_trace(trace, sidecar=Path(folder) / "warm-up.summary.json").operator_table()


def _serve(control: socket.socket, wakeup: int, staging: list[str], output: str) -> None:
    watched: list[socket.socket | int] = [control, wakeup]
    while True:
        try:
            readable, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        if wakeup in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wakeup, 4096):
                    pass
            _reap(control)
        if control in readable:
            try:
                message, fds, _, _ = socket.recv_fds(control, _MESSAGE_BYTES, 1)
            except OSError:
                return
            if not message:  # the training process closed its end
                return
            _start_worker(control, message, fds, (wakeup,), staging, output)


def _start_worker(control: socket.socket, message: bytes, fds: list[int], close_in_worker: Sequence[int],
                  staging: list[str], output: str) -> None:
    status_fd = fds[0] if fds else None
    for extra in fds[1:]:
        os.close(extra)
    if not message.startswith(b"job "):
        _send(control, b"failed unknown request")
        return
    job_path = os.fsdecode(message[4:])
    try:
        pid = os.fork()
    except OSError as err:
        _send(control, f"failed fork: {err.strerror or err}".encode())
        pid = -1
    if pid == 0:
        code = EXIT_PUBLISH_FAILED
        try:
            control.close()
            for fd in close_in_worker:
                os.close(fd)
            code = _work(job_path, status_fd, staging, output)
        except SystemExit as exit_:  # SIGTERM: the publisher's handler unwound it
            code = exit_.code if isinstance(exit_.code, int) else EXIT_PUBLISH_FAILED
        finally:
            os._exit(code)
    if pid > 0:
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(pid)
        _send(control, b"started %d" % pid, [pidfd] if pidfd is not None else [])
        if pidfd is not None:
            os.close(pidfd)
    if status_fd is not None:
        os.close(status_fd)


def _work(job_path: str, status_fd: int | None, staging: list[str], output: str) -> int:
    """In the worker: the publisher's signals, then its job."""
    from torchprof_args.runtime.export import publisher

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, publisher.exit_on_sigterm)
    return publisher.run_job(job_path, staging, output, status_fd)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        cpu = usage.ru_utime + usage.ru_stime
        _send(control, b"exited %d %d %.6f" % (pid, os.waitstatus_to_exitcode(status), cpu))


def _send(control: socket.socket, message: bytes, fds: Sequence[int] = ()) -> None:
    with contextlib.suppress(OSError):  # the training process is gone: its workers still finish
        socket.send_fds(control, [message], list(fds))


# -- the training process's side ------------------------------------------------------------------


def forkserver_argv(control_fd: int, staging_dirs: Sequence[str], output_dir: str,
                    priority: str) -> list[str]:
    """The command line that starts a fork server on ``control_fd``."""
    argv = [sys.executable, "-m", __name__, "--control-fd", str(control_fd), "--output", output_dir,
            "--priority", priority]
    for directory in staging_dirs:
        argv += ["--staging", directory]
    return argv


class Worker:
    """A worker of the fork server: one trace being published."""

    def __init__(self, pid: int, pidfd: int | None) -> None:
        self.pid = pid
        #: Refers to this very process even after it ended (no signal to a reused pid); None where the
        #: platform has no pidfd.
        self.pidfd = pidfd


class ForkServer:
    """The training process's handle on its fork server (used by the writer's reaper thread)."""

    def __init__(self, control: socket.socket, process: subprocess.Popen[bytes]) -> None:
        self._control = control
        self.process = process
        self.ready = False
        self._lock = threading.Lock()
        self._replies: list[tuple[bytes, list[int]]] = []
        #: pid -> (exit code, CPU seconds) of workers that ended.
        self._exits: dict[int, tuple[int, float]] = {}
        self._broken = False

    @classmethod
    def start(cls, staging_dirs: Sequence[str], output_dir: str, priority: str, env: dict[str, str],
              keep_fds: Sequence[int] = ()) -> ForkServer:
        """Start a fork server; raises ``OSError`` when it cannot (the caller starts publishers per trace).

        ``keep_fds`` (the staging locks) stay open in the server and its workers.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                forkserver_argv(theirs.fileno(), staging_dirs, output_dir, priority), env=env,
                start_new_session=True, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(), *keep_fds))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(ours, process)

    @property
    def alive(self) -> bool:
        return not self._broken and self.process.poll() is None

    def ended_how(self, wait: float = 0.2) -> str:
        """`` (killed by SIGKILL)`` or `` (exit code N)`` once the server has ended, waiting up to
        ``wait`` s for a dying one to be reaped (its memory is freed before its parent can reap it);
        "" when it has not ended."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=wait)
        code = self.process.returncode
        if code is None:
            return ""
        return f" (killed by {signal.Signals(-code).name})" if code < 0 else f" (exit code {code})"

    def poll_ready(self) -> bool:
        """Whether the server has said it is ready (its imports done), without waiting."""
        with self._lock:
            while not self.ready and self._read(time.monotonic() + 1e-3, wait=0.0):
                pass
            return self.ready

    def start_worker(self, job_path: str, status_fd: int, deadline: float) -> Worker:
        """Ask for a worker that publishes ``job_path`` and reports on ``status_fd`` (a copy is sent;
        the caller closes its own); waits for its pid until ``deadline`` (monotonic: the trace's flush
        timeout; a server still importing or starved answers late, as a fresh publisher would start
        late).  Raises :class:`ForkServerError`."""
        with self._lock:
            if not self.alive:
                raise ForkServerError(f"the publisher fork server has ended{self.ended_how()}", sent=False)
            try:
                socket.send_fds(self._control, [b"job " + os.fsencode(job_path)], [status_fd])
            except OSError as err:
                self._broken = True
                raise ForkServerError(f"the publisher fork server cannot be reached ({err.strerror or err})",
                                      sent=False) from None
            while not self._replies:
                if not self._read(deadline):
                    if not self.alive:
                        raise ForkServerError("the publisher fork server ended before starting a worker "
                                              "for it", sent=True)
                    self.kill()  # it may still answer: later traces must not wait behind this one
                    raise ForkServerError("the publisher fork server did not start a worker for it before "
                                          "--torch-profile-flush-timeout", sent=True)
            reply, fds = self._replies.pop(0)
        if reply.startswith(b"started "):
            return Worker(int(reply.split()[1]), fds[0] if fds else None)
        for fd in fds:
            os.close(fd)
        raise ForkServerError(f"the publisher fork server could not start a worker: "
                              f"{reply.decode(errors='replace')}", sent=True)

    def wait_worker(self, worker: Worker, deadline: float) -> tuple[int | None, float | None] | None:
        """Wait until ``worker`` ended or ``deadline``: ``(exit code, CPU seconds)``, either None when the
        server could not say (it died first); None when the worker is still running."""
        with self._lock:
            while worker.pid not in self._exits:
                if self._broken or self.process.poll() is not None:
                    return _wait_pidfd(worker, deadline)
                if not self._read(deadline):
                    return None
            code, cpu = self._exits.pop(worker.pid)
        return code, cpu

    def close(self, wait: float = 2.0) -> None:
        """Close the socket (the server exits at once; its workers finish), reap the server."""
        with contextlib.suppress(OSError):
            self._control.close()
        try:
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(OSError):
            self._control.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2.0)

    def _read(self, deadline: float, wait: float | None = None) -> bool:
        """Read one message (waiting until ``deadline``, or ``wait`` seconds); False when none came or
        the server is gone."""
        remaining = deadline - time.monotonic() if wait is None else wait
        if remaining < 0 or (remaining == 0 and wait is None):
            return False
        try:
            readable, _, _ = select.select([self._control], [], [], remaining)
            if not readable:
                return False
            message, fds, _, _ = socket.recv_fds(self._control, _MESSAGE_BYTES, 1)
        except (OSError, ValueError):  # ValueError: closed by kill() meanwhile
            self._broken = True
            return False
        if not message:
            self._broken = True
            return False
        if message == b"ready":
            self.ready = True
        elif message.startswith(b"exited "):
            _, pid, code, cpu = message.split()
            self._exits[int(pid)] = (int(code), float(cpu))
        else:
            self._replies.append((message, fds))
        return True


def _wait_pidfd(worker: Worker, deadline: float) -> tuple[int | None, float | None] | None:
    """A worker whose server died: wait for its end (its exit code is lost with the server)."""
    while True:
        remaining = deadline - time.monotonic()
        if worker.pidfd is not None:
            readable, _, _ = select.select([worker.pidfd], [], [], max(0.0, remaining))
            return (None, None) if readable else None
        if not pid_alive(worker.pid):
            return None, None
        if remaining <= 0:
            return None
        time.sleep(min(remaining, 0.1))


if __name__ == "__main__":
    sys.exit(main())
