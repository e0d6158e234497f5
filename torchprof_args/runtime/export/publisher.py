"""The publisher: a fresh process that compresses a staged trace into the output directory.

Started as ``python -m torchprof_args.runtime.export.publisher JOB.json`` (by ``exec`` from the
forked exporter, or spawned after an inline export).  It compresses the staged trace into the
(possibly slow, shared) output directory under a hidden temporary name, renames it into place,
publishes its companion files (the window's execution trace) beside it the same way, writes the
per-trace operator summary, and records a status file that the training process reads when the
publisher exits.  Nothing half-written is ever left under a name a user
would open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from torchprof_args.atomic import atomic_output, write_text_atomically

__all__ = ["PublishJob", "publish", "publisher_argv", "publisher_env"]

_COPY_CHUNK = 16 << 20


@dataclasses.dataclass
class PublishJob:
    """Everything the publisher process needs, written to the job file as JSON."""

    staged_path: str
    trace_path: str
    status_path: str
    gzip_level: int | None = 6
    summary_path: str | None = None
    summary_rows: int = 30
    rank: int = 0
    #: ``[staged path, published path]`` of files published beside the trace (compressed like it).
    companions: list[list[str]] = dataclasses.field(default_factory=list)

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
        _publish_companions(job, status)
        status["publish_seconds"] = time.perf_counter() - started
        if job.summary_path:
            try:
                status["summary_path"] = _write_summary(staged, job, trace_path)
            except Exception as err:  # the trace is published; a summary failure is reported only
                status["summary_error"] = f"{type(err).__name__}: {err}"
    except Exception as err:
        status["error"] = f"{type(err).__name__}: {err}"
    finally:
        for leftover in [staged, *(Path(source) for source, _ in job.companions)]:
            with contextlib.suppress(OSError):
                leftover.unlink()
    status["seconds"] = time.perf_counter() - started
    return status


def _publish_companions(job: PublishJob, status: dict[str, Any]) -> None:
    """Each companion through the same hidden name, fsync and rename as the trace; a failure is reported only."""
    for source, target in job.companions:
        try:
            _copy_compressed(Path(source), Path(target), job.gzip_level)
            status.setdefault("companions", []).append(target)
        except Exception as err:  # the trace is published; a companion failure is reported only
            status.setdefault("companion_errors", []).append(f"{Path(target).name}: {type(err).__name__}: {err}")


def _write_summary(staged: Path, job: PublishJob, published: Path) -> str:
    """The per-trace operator table, read from the uncompressed staged copy (fast, local)."""
    from torchprof_args.analysis import format_profiler_list, load_trace, summarize

    summary = summarize(load_trace(staged, progress=False), top=job.summary_rows)
    summary["file"] = str(published)
    with atomic_output(job.summary_path, "w", fsync=True) as handle:
        handle.write(format_profiler_list(summary, rows=job.summary_rows))
    return job.summary_path


def main(job_path: str) -> int:
    """Publish the job in ``job_path``; always leaves a status file; exit code 1 on failure."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind so partial files are removed
    job = PublishJob.load(job_path)
    status: dict[str, Any]
    try:
        status = publish(job)
    except SystemExit:
        status = {"trace_path": job.trace_path, "rank": job.rank, "error": "publisher terminated"}
        raise
    finally:
        write_text_atomically(job.status_path, json.dumps(status))
        with contextlib.suppress(OSError):
            os.unlink(job_path)
    return 1 if "error" in status else 0


def publisher_argv(job_path: str) -> list[str]:
    return [sys.executable, "-m", __name__, job_path]


def publisher_env() -> dict[str, str]:
    """The training process's environment, with this package importable for sure."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'publisher'} JOB.json  (started by TorchProfiler)")
    sys.exit(main(sys.argv[1]))
