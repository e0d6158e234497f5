"""Getting a finished trace from the profiler to the output directory without stalling training.

The training thread only pays for ``stop()``.  Everything after it runs in other processes:

* ``export_mode="fork"`` (default on Linux): the profiled process forks; the child serialises
  the collected results (``export_chrome_trace`` holds the GIL, so a thread cannot hide it) to
  node-local staging and then ``exec``\\ s the publisher below, a fresh Python process.
* ``export_mode="inline"``: the training thread exports to staging (fast local disk), then spawns
  the publisher.  Slower, but no ``fork`` of the training process.

The publisher (``python -m torchprof_args.trace_writer JOB.json``) compresses the staged trace
into the (possibly slow, shared) output directory under a hidden temporary name, renames it into
place atomically, writes the per-rank operator summary the same way, and records a status file
that the training process reads when the publisher exits.  A reaper thread in the training
process waits on the publisher (without holding the GIL), logs the outcome with the rank, and
enforces timeouts.  Nothing half-written is ever left under a name a user would open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchprof_args.atomic import atomic_output, partial_path
from torchprof_args.log import get_logger

logger = get_logger(__name__)

TRACE_SUFFIX = ".pt.trace.json"
GZIP_SUFFIX = ".gz"
SUMMARY_SUFFIX = ".profiler_list.dat"
_COPY_CHUNK = 16 << 20
#: /dev/shm is used for staging only when it has at least this much room.
STAGING_MIN_FREE_BYTES = 4 << 30


def short_hostname() -> str:
    return socket.gethostname().split(".")[0] or "host"


def trace_stem(rank: int, first_iteration: int, last_iteration: int, *, host: str | None = None,
               pid: int | None = None) -> str:
    """The file-name stem of one cycle's trace: unique per rank, host, process and cycle.

    Sorted listings group by rank; TensorBoard's profiler plugin reads the whole stem as the
    worker name.  Example: ``rank00003_node17_pid4242_iter000120-000121``.
    """
    host = host or short_hostname()
    pid = os.getpid() if pid is None else pid
    return f"rank{rank:05d}_{host}_pid{pid}_iter{first_iteration:06d}-{last_iteration:06d}"


def choose_staging_dir(requested: str | None, min_free_bytes: int = STAGING_MIN_FREE_BYTES) -> Path:
    """Node-local staging: ``requested``, else /dev/shm when it has room, else the temp dir."""
    if requested:
        base = Path(requested)
    else:
        base = Path(os.environ.get("TMPDIR", "/tmp"))
        shm = Path("/dev/shm")
        with contextlib.suppress(OSError):
            if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= min_free_bytes:
                base = shm
    path = base / f"torchprof-{os.getuid()}" / f"pid{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


# ---------------------------------------------------------------------------------------------
# The publisher (runs in its own process).


@dataclasses.dataclass
class PublishJob:
    """Everything the publisher process needs, written to ``job_path`` as JSON."""

    staged_path: str
    trace_path: str
    status_path: str
    gzip_level: int | None = 6
    summary_path: str | None = None
    summary_rows: int = 30
    rank: int = 0

    def save(self, job_path: str | os.PathLike[str]) -> None:
        Path(job_path).write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def load(cls, job_path: str | os.PathLike[str]) -> PublishJob:
        return cls(**json.loads(Path(job_path).read_text()))


def _copy_compressed(source: Path, target: Path, level: int | None) -> None:
    with atomic_output(target, "wb", fsync=True) as handle, open(source, "rb") as src:
        if level is None:
            shutil.copyfileobj(src, handle, _COPY_CHUNK)
            return
        import gzip

        # zlib releases the GIL while deflating each chunk; this process has no other work.
        with gzip.GzipFile(filename="", mode="wb", fileobj=handle, compresslevel=level, mtime=0) as gz:
            shutil.copyfileobj(src, gz, _COPY_CHUNK)


def publish(job: PublishJob) -> dict[str, Any]:
    """Compress and publish one staged trace and its summary; returns the status record."""
    started = time.perf_counter()
    status: dict[str, Any] = {"trace_path": job.trace_path, "rank": job.rank}
    staged = Path(job.staged_path)
    try:
        status["raw_mb"] = staged.stat().st_size / 1e6
        trace_path = Path(job.trace_path)
        _copy_compressed(staged, trace_path, job.gzip_level)
        status["trace_mb"] = trace_path.stat().st_size / 1e6
        status["publish_seconds"] = time.perf_counter() - started
        if job.summary_path:
            try:
                status["summary_path"] = _write_summary(staged, job, trace_path)
            except Exception as err:  # the trace is published; a summary failure is reported only
                status["summary_error"] = f"{type(err).__name__}: {err}"
    except Exception as err:
        status["error"] = f"{type(err).__name__}: {err}"
    finally:
        with contextlib.suppress(OSError):
            staged.unlink()
    status["seconds"] = time.perf_counter() - started
    return status


def _write_summary(staged: Path, job: PublishJob, published: Path) -> str:
    """The per-rank operator table, read from the uncompressed staged copy (fast, local)."""
    from torchprof_args.analysis import format_profiler_list, load_trace, summarize

    summary = summarize(load_trace(staged, progress=False), top=job.summary_rows)
    summary["file"] = str(published)
    text = format_profiler_list(summary, rows=job.summary_rows)
    with atomic_output(job.summary_path, "w", fsync=True) as handle:
        handle.write(text)
    return job.summary_path


def _publisher_main(job_path: str) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind so partial files are removed
    job = PublishJob.load(job_path)
    status: dict[str, Any]
    try:
        status = publish(job)
    except SystemExit:
        status = {"trace_path": job.trace_path, "rank": job.rank, "error": "publisher terminated"}
        raise
    finally:
        Path(job.status_path).write_text(json.dumps(status))
        with contextlib.suppress(OSError):
            os.unlink(job_path)
    return 1 if "error" in status else 0


def _publisher_argv(job_path: str) -> list[str]:
    return [sys.executable, "-m", "torchprof_args.trace_writer", job_path]


def _publisher_env() -> dict[str, str]:
    """The training process's environment, with this package importable for sure."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


# ---------------------------------------------------------------------------------------------
# The training-process side.


@dataclasses.dataclass
class _Pending:
    pid: int
    job: PublishJob
    job_path: str
    started: float
    popen: subprocess.Popen[bytes] | None = None


class TraceWriter:
    """Hands finished traces to publisher processes and reaps them off the training thread."""

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        staging_dir: Path,
        *,
        rank: int,
        gzip_level: int | None = 6,
        summary_rows: int | None = 30,
        export_mode: str = "fork",
        publish_timeout: float = 1800.0,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.staging_dir = staging_dir
        self.rank = rank
        self.gzip_level = gzip_level
        self.summary_rows = summary_rows
        self.export_mode = export_mode if hasattr(os, "fork") else "inline"
        self.publish_timeout = publish_timeout
        self.stats: dict[str, float] = {"traces_written": 0, "trace_mb": 0.0, "publish_seconds": 0.0,
                                        "publish_failures": 0}
        self.published: list[str] = []
        self._pending: queue.Queue[_Pending | None] = queue.Queue()
        self._in_flight: set[int] = set()
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None

    # -- submitting ------------------------------------------------------------------------

    def job_for(self, stem: str) -> PublishJob:
        suffix = TRACE_SUFFIX + (GZIP_SUFFIX if self.gzip_level is not None else "")
        return PublishJob(
            staged_path=str(self.staging_dir / f"{stem}{TRACE_SUFFIX}"),
            trace_path=str(self.output_dir / f"{stem}{suffix}"),
            status_path=str(self.staging_dir / f"{stem}.status.json"),
            gzip_level=self.gzip_level,
            summary_path=str(self.output_dir / f"{stem}{SUMMARY_SUFFIX}") if self.summary_rows else None,
            summary_rows=self.summary_rows or 0,
            rank=self.rank,
        )

    def submit(self, export: Callable[[str], None], stem: str) -> None:
        """Export a stopped profiler's trace via ``export(path)`` and publish it in the background.

        Never raises: failures are logged with the rank and training goes on.
        """
        try:
            job = self.job_for(stem)
            job_path = str(self.staging_dir / f"{stem}.job.json")
            job.save(job_path)
            if self.export_mode == "fork":
                pid = self._fork_export(export, job, job_path)
                pending = _Pending(pid, job, job_path, time.monotonic())
            else:
                staged_tmp = partial_path(job.staged_path)
                export(str(staged_tmp))
                os.replace(staged_tmp, job.staged_path)
                popen = subprocess.Popen(
                    _publisher_argv(job_path), env=_publisher_env(), start_new_session=True,
                    stdin=subprocess.DEVNULL,
                )
                pending = _Pending(popen.pid, job, job_path, time.monotonic(), popen)
        except Exception as err:
            self.stats["publish_failures"] += 1
            logger.error("rank %d: could not export trace %s: %s: %s; training continues",
                         self.rank, stem, type(err).__name__, err)
            return
        with self._lock:
            self._in_flight.add(pending.pid)
        self._ensure_reaper()
        self._pending.put(pending)

    def _fork_export(self, export: Callable[[str], None], job: PublishJob, job_path: str) -> int:
        argv, env = _publisher_argv(job_path), _publisher_env()
        staged_tmp = str(partial_path(job.staged_path))
        pid = os.fork()
        if pid:
            return pid
        # Child: only this thread exists.  Export, then replace this process image with the
        # publisher so no inherited state (locks, sockets, CUDA) lingers.  Never return.
        code = 1
        try:
            os.setsid()
            export(staged_tmp)
            os.replace(staged_tmp, job.staged_path)
            os.closerange(3, _max_fd())
            os.execve(argv[0], argv, env)
        except BaseException as err:  # noqa: BLE001 - report anything, then leave
            with contextlib.suppress(BaseException):
                Path(job.status_path).write_text(json.dumps(
                    {"trace_path": job.trace_path, "rank": job.rank,
                     "error": f"export failed in forked child: {type(err).__name__}: {err}"}))
                os.unlink(staged_tmp)
        finally:
            os._exit(code)

    # -- reaping ---------------------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap_loop, name="torchprof-reaper", daemon=True)
            self._reaper.start()

    def _reap_loop(self) -> None:
        while True:
            pending = self._pending.get()
            if pending is None:
                return
            deadline = pending.started + self.publish_timeout
            if not _wait_pid(pending, deadline):
                logger.error("rank %d: publishing %s took longer than %.0f s; stopping it",
                             self.rank, pending.job.trace_path, self.publish_timeout)
                _terminate(pending)
            self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        status: dict[str, Any] = {"error": "publisher exited without a status"}
        with contextlib.suppress(OSError, ValueError):
            status = json.loads(Path(pending.job.status_path).read_text())
            os.unlink(pending.job.status_path)
        leftovers = [pending.job_path, pending.job.staged_path, partial_path(pending.job.staged_path),
                     partial_path(pending.job.trace_path)]
        if pending.job.summary_path:
            leftovers.append(partial_path(pending.job.summary_path))
        for leftover in leftovers:  # only present if the publisher was killed
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        with self._lock:
            self._in_flight.discard(pending.pid)
            if "error" in status:
                self.stats["publish_failures"] += 1
            else:
                self.stats["traces_written"] += 1
                self.stats["trace_mb"] = status.get("trace_mb", 0.0)
                self.stats["publish_seconds"] = status.get("seconds", 0.0)
                self.published.append(status["trace_path"])
        if "error" in status:
            logger.error("rank %d: trace %s was not written: %s", self.rank, pending.job.trace_path,
                         status["error"])
            return
        logger.info("rank %d: trace written to %s (%.1f MB, %.1f s after the flush)", self.rank,
                    status["trace_path"], status.get("trace_mb", 0.0), time.monotonic() - pending.started)
        if "summary_error" in status:
            logger.warning("rank %d: no summary for %s: %s", self.rank, status["trace_path"],
                           status["summary_error"])

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for publishers; stop and clean up any still running."""
        if self._reaper is None:
            with contextlib.suppress(OSError):
                self.staging_dir.rmdir()
            return
        deadline = time.monotonic() + timeout
        if self.in_flight:
            logger.info("rank %d: waiting up to %.0f s for %d trace(s) to be published", self.rank,
                        timeout, self.in_flight)
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.in_flight:
            logger.error("rank %d: %d trace(s) not published within --torch-profile-exit-timeout "
                         "(%.0f s); stopping them", self.rank, self.in_flight, timeout)
            with self._lock:
                pids = list(self._in_flight)
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + 10
            while self.in_flight and time.monotonic() < end:
                time.sleep(0.05)
        self._pending.put(None)
        self._reaper.join(timeout=10)
        self._reaper = None
        with contextlib.suppress(OSError):
            self.staging_dir.rmdir()  # only succeeds when nothing was left behind


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 65536


def _wait_pid(pending: _Pending, deadline: float) -> bool:
    """Wait (without holding the GIL) until the publisher exits or ``deadline``; True if it exited."""
    if pending.popen is not None:
        try:
            pending.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pending.pid)
    try:
        while True:
            try:
                done, _ = os.waitpid(pending.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped (e.g. SIGCHLD ignored by the application)
                return True
            if done:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if pidfd is not None:
                select.select([pidfd], [], [], min(remaining, 60.0))
            else:
                time.sleep(min(remaining, 0.1))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _terminate(pending: _Pending) -> None:
    with contextlib.suppress(OSError):
        os.kill(pending.pid, signal.SIGTERM)
    if not _wait_pid(pending, time.monotonic() + 10):
        with contextlib.suppress(OSError):
            os.kill(pending.pid, signal.SIGKILL)
        _wait_pid(pending, time.monotonic() + 10)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m torchprof_args.trace_writer JOB.json  (started by TorchProfiler)")
    sys.exit(_publisher_main(sys.argv[1]))
