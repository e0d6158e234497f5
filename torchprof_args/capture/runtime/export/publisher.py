"""The rank's publisher: one long-lived process that compresses staged traces into the output directory.

Started once per traced rank (:mod:`~torchprof_args.capture.runtime.export.publication`) as ``python -m
torchprof_args.capture.runtime.export.publisher --staging DIR --output DIR --priority P``, so its interpreter
and imports (numpy, msgspec, the trace analysis) are paid once, not per trace.  It reads one
:class:`PublishJob` per line (JSON) on stdin and answers one :class:`PublishStatus` line on stdout,
one job at a time, until its input ends (the writer closed, or the training process died).  It
accepts a job only if its files lie in the staging and output directories named on its command
line (:meth:`PublishJob.check <torchprof_args.capture.runtime.export.job.PublishJob.check>`), then
publishes, each under a hidden temporary name renamed into place:

1. the trace, gzip-compressed into the (possibly slow, shared) output directory;
2. its summary sidecar and operator table, parsed once from the staged copy;
3. ``extra_files``: more files that belong with this trace (an execution trace).

SIGTERM unwinds it, so its partial files are removed; what a SIGKILL leaves, the training process
removes.  Nothing half-written is ever left under a name a user would open.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import BinaryIO

import msgspec

from torchprof_args.atomic import atomic_output
from torchprof_args.capture.runtime.export.compress import copy_compressed
from torchprof_args.capture.runtime.export.job import JobRejected, PublishJob
from torchprof_args.capture.runtime.export.priority import IDLE, NORMAL, PRIORITIES, lower_to_background
from torchprof_args.capture.runtime.export.status import PublishCpu, PublishStatus, ended_how
from torchprof_args.log import get_logger

__all__ = ["PublishJob", "PublishStatus", "PublisherProcess", "publish", "publisher_argv", "publisher_env",
           "serve"]

#: Between SIGTERM and SIGKILL for a publisher being stopped.
_STOP_SECONDS = 2.0
_STATUS = msgspec.json.Decoder(PublishStatus)

try:
    import resource
except ImportError:  # pragma: no cover - not Unix: no decoding processes' CPU time
    resource = None  # type: ignore[assignment]


def _cpu_seconds() -> float:
    """This process's CPU time, its ended children's included."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN) if resource is not None else None
    return time.process_time() + (children.ru_utime + children.ru_stime if children else 0.0)


def publish(job: PublishJob, *, cpu: PublishCpu | None = None) -> PublishStatus:
    """Publish one staged trace, its summary sidecar, operator table and extra files; returns what
    became of it.

    Staged files are removed whatever happens.  ``cpu`` (in a publisher process): filled with this
    process's CPU time by phase, and returned in the status.
    """
    started = time.perf_counter()
    status = PublishStatus(trace_path=job.trace_path, rank=job.rank)
    clock = _PhaseClock(cpu) if cpu is not None else None
    staged = Path(job.staged_path)
    try:
        status.raw_mb = staged.stat().st_size / 1e6
        trace_path = Path(job.trace_path)
        compressor = copy_compressed(staged, trace_path, job.gzip_level)
        status.compressor = f"{compressor.library} {compressor.level}"
        status.trace_mb = trace_path.stat().st_size / 1e6
        status.trace_seconds = time.perf_counter() - started
        _phase_done(clock, "trace")
        if job.operator_table_path:
            try:
                status.operator_table_path, status.left_out = _write_summary_files(
                    staged, job, trace_path, job.operator_table_path)
            except Exception as err:  # the trace is published; a summary failure is reported only
                status.summary_error = f"{type(err).__name__}: {err}"
        _phase_done(clock, "summary")
        _publish_extra_files(job, status)
        _phase_done(clock, "extra")
    except Exception as err:
        status.error = f"{type(err).__name__}: {err}"
    finally:
        for path in job.staged_files():
            with contextlib.suppress(OSError):
                os.unlink(path)
    status.publish_seconds = time.perf_counter() - started
    status.cpu = cpu
    return status


class _PhaseClock:
    """Charges this process's CPU time to the phases of a :class:`PublishCpu`, one after another."""

    def __init__(self, cpu: PublishCpu) -> None:
        self.cpu = cpu
        self.mark = _cpu_seconds()

    def charge(self, phase: str) -> None:
        now = _cpu_seconds()
        setattr(self.cpu, phase, getattr(self.cpu, phase) + now - self.mark)
        self.mark = now


def _phase_done(clock: _PhaseClock | None, phase: str) -> None:
    """Charge the CPU time since the last phase ended to ``phase`` (a field of :class:`PublishCpu`)."""
    if clock is not None:
        clock.charge(phase)


def _publish_extra_files(job: PublishJob, status: PublishStatus) -> None:
    """Step 3: files that belong with this trace; a failure is reported beside the trace's success."""
    for staged, target, level in job.extra_files:
        try:
            copy_compressed(staged, target, level)
            status.extra_files.append(str(target))
        except Exception as err:  # noqa: BLE001 - the trace itself is published
            status.extra_errors.append(f"{target}: {type(err).__name__}: {err}")


def _write_summary_files(staged: Path, job: PublishJob, published: Path,
                         operator_table: str) -> tuple[str, dict[str, str]]:
    """Step 2: the trace's summary, parsed from the uncompressed staged copy (fast, local),
    published as its sidecar (``summaries/<stem>.summary.json``, with the rank's part of ``torchprof
    diagnose``: what ``torchprof summary`` / ``diagnose`` then
    reads instead of the trace) and rendered as its operator table
    (``summaries/<stem>.operator_table.txt``); returns the operator table's path and the sidecar's
    parts left out (over what is left of the trace's analysis budget, ``--torch-profile-analysis-budget``:
    the summary always fits, the rest is computed from the trace when a command asks)."""
    from torchprof_args.analysis.staged import summarise_trace

    # a diagnosis that fails must not cost the trace its summary: it is stored as null, and
    # `torchprof diagnose` then parses the trace; the memory part is the exporter's when it wrote one.
    summarised = summarise_trace(staged, published=published,
                                 sidecar=Path(job.sidecar_path) if job.sidecar_path else None,
                                 exporter_memory=job.memory_path, budget=job.analysis_deadline())
    with atomic_output(operator_table, "w", fsync=True) as handle:
        handle.write(summarised.operator_table(rows=job.operator_table_rows))
    return operator_table, summarised.left_out


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The publisher's SIGTERM handler: unwinds through ``atomic_output``, which removes the partial file."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Publish the jobs read on stdin, answering each on stdout (see the module docstring)."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    parser = argparse.ArgumentParser(prog="python -m torchprof_args.capture.runtime.export.publisher",
                                     description="Publish staged traces, one job per line on stdin "
                                                 "(started by TorchProfiler).")
    parser.add_argument("--staging", action="append", required=True, help="a staging directory (repeatable)")
    parser.add_argument("--output", required=True, help="the output directory")
    parser.add_argument("--priority", choices=PRIORITIES, default=NORMAL,
                        help="idle: lower this process to the lowest CPU and I/O priority "
                             "(--torch-profile-publisher-priority); normal (default): leave it as it is")
    parser.add_argument("--parent", type=int, default=None,
                        help="the training process: the publisher ends when it is gone (default: the "
                             "parent at start)")
    args = parser.parse_args(argv)
    # the trainer's pid as it started us, not as found after our imports: it may have died meanwhile
    parent = args.parent if args.parent is not None else os.getppid()
    if args.priority == IDLE:
        for skipped in lower_to_background():  # TORCHPROF_LOG_LEVEL=DEBUG shows what this platform lacks
            get_logger(__name__).debug("publisher priority not lowered: %s", skipped)
    # the summary's imports, once, while training starts rather than at the first trace
    from torchprof_args.analysis import staged  # noqa: F401

    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not end up among the replies
    return serve(sys.stdin.fileno(), replies, args.staging, args.output, parent=parent)


def serve(jobs: int, replies: BinaryIO, staging: list[str], output: str, *, parent: int | None = None) -> int:
    """Publish each job line read from the descriptor ``jobs`` in turn, one status line on ``replies``
    each, until its end or until the process ``parent`` (the training process) is gone; returns 0."""
    mark = 0.0  # this process's CPU time when the last job was answered: the first job's start counts
    for line in _job_lines(jobs, parent):
        if line.strip():
            status = run_job(line, staging, output, start_cpu=_cpu_seconds() - mark)
            replies.write(msgspec.json.encode(status) + b"\n")
            replies.flush()
            mark = _cpu_seconds()
    return 0


def _job_lines(fd: int, parent: int | None) -> Iterator[bytes]:
    """The lines read from ``fd`` until its end, or until ``parent`` is not our parent any more (a forked
    child of the training process may hold our input open after it died)."""
    buffered = b""
    while True:
        if b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield line
            continue
        readable, _, _ = select.select([fd], [], [], 1.0)
        if not readable:
            if parent is not None and os.getppid() != parent:
                return
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buffered += chunk


def run_job(line: bytes, staging: list[str], output: str, *, start_cpu: float = 0.0) -> PublishStatus:
    """Check and publish one job line (its files within ``staging`` and ``output``); its outcome.

    ``start_cpu``: CPU seconds spent before this job since the last one (the first job: the
    interpreter and imports), kept apart in the status.
    """
    try:
        job = PublishJob.decode(line, staging, output)
    except JobRejected as err:
        print(f"torchprof publisher: {err}", file=sys.stderr)
        return PublishStatus(error=f"publisher rejected the job: {err}")
    cpu = PublishCpu(start=start_cpu)
    status = publish(job, cpu=cpu)
    get_logger(__name__).debug(
        "rank %d: publisher of %s: %.3f s CPU: %.3f starting (the first job: interpreter, imports), "
        "%.3f the trace (%s), %.3f its summary, %.3f extra files; the export took %.3f s of CPU, the "
        "exporter's memory categorisation %.3f", job.rank, job.trace_path, cpu.total, cpu.start,
        cpu.trace, status.compressor, cpu.summary, cpu.extra, job.export_seconds or 0.0,
        job.categorisation_spent)
    return status


def publisher_argv(staging_dirs: list[str], output_dir: str, priority: str = IDLE) -> list[str]:
    """The command line that starts a rank's publisher (at ``priority``, see
    :mod:`~torchprof_args.capture.runtime.export.priority`)."""
    argv = [sys.executable, "-m", __name__, "--output", output_dir, "--priority", priority,
            "--parent", str(os.getpid())]
    for directory in staging_dirs:
        argv += ["--staging", directory]
    return argv


class PublisherProcess:
    """The training process's handle on the rank's publisher (used by the publications thread only)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self._replies = b""
        assert popen.stdin is not None and popen.stdout is not None  # noqa: S101 - started with pipes
        self._input, self.output = popen.stdin, popen.stdout.fileno()
        os.set_blocking(self.output, False)

    @classmethod
    def start(cls, staging_dirs: list[str], output_dir: str, priority: str,
              keep_fds: tuple[int, ...] = ()) -> PublisherProcess:
        """Start a publisher for these directories; raises ``OSError`` when it cannot start.  ``keep_fds``
        (the staging locks) stay open in it."""
        popen = subprocess.Popen(publisher_argv(staging_dirs, output_dir, priority), env=publisher_env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                 start_new_session=True, pass_fds=keep_fds)
        return cls(popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send(self, job: PublishJob) -> None:
        """Give it ``job`` (it reads between jobs); a publisher gone shows as the end of :meth:`replies`."""
        with contextlib.suppress(OSError):
            os.write(self._input.fileno(), job.encode())

    def replies(self) -> list[PublishStatus] | None:
        """The answers readable now (an unreadable one: a status saying so); None once its output ended."""
        try:
            data = os.read(self.output, 1 << 16)
        except BlockingIOError:
            return []
        if not data:
            return None
        *lines, self._replies = (self._replies + data).split(b"\n")
        answers = []
        for line in lines:
            try:
                answers.append(_STATUS.decode(line))
            except msgspec.DecodeError as err:
                answers.append(PublishStatus(error=f"the publisher's answer cannot be read: {err}"))
        return answers

    def ended(self) -> str:
        """Once its output ended: how it ended (``was killed by SIGKILL``)."""
        self._close_pipes()
        try:
            return ended_how(self.popen.wait(timeout=_STOP_SECONDS))
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return "closed its output"

    def stop(self) -> None:
        """SIGTERM (it removes its partial files), SIGKILL after a moment (a frozen one)."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(OSError):
                self.popen.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=_STOP_SECONDS)
                break
        self._close_pipes()

    def close(self) -> None:
        """Idle: end its input, so it exits (stopped when it does not, e.g. a forked child of the trainer
        holds its input open)."""
        self._close_pipes()
        try:
            self.popen.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            self.stop()

    def _close_pipes(self) -> None:
        for pipe in (self.popen.stdin, self.popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def publisher_env() -> dict[str, str]:
    """The training process's environment, with this package importable for sure."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


if __name__ == "__main__":
    sys.exit(main())
