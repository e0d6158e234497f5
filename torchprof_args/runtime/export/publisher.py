"""The publisher: a fresh process that compresses a staged trace into the output directory.

Started as ``python -m torchprof_args.runtime.export.publisher JOB.json --staging DIR
--output DIR [--status-fd N]`` (by ``exec`` from the forked exporter, or spawned after an inline
export).  It accepts the job only if its files lie in the staging and output directories named on
its command line (:meth:`PublishJob.load <torchprof_args.runtime.export.job.PublishJob.load>`),
then publishes, each under a hidden temporary name renamed into place:

1. the trace, gzip-compressed into the (possibly slow, shared) output directory;
2. its summary sidecar and operator table, parsed once from the staged copy;
3. ``extra_files``: more files that belong with this trace (an execution trace).

Its outcome goes back to the training process on the status pipe.  SIGTERM unwinds it, so its
partial files are removed; what a SIGKILL leaves, the training process removes.  Nothing
half-written is ever left under a name a user would open.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from torchprof_args.atomic import atomic_output
from torchprof_args.log import get_logger
from torchprof_args.runtime.export.compress import copy_compressed
from torchprof_args.runtime.export.job import EXIT_PUBLISH_FAILED, EXIT_REJECTED, JobRejected, PublishJob
from torchprof_args.runtime.export.priority import IDLE, NORMAL, PRIORITIES, lower_to_background
from torchprof_args.runtime.export.status import PublishCpu, PublishStatus, report_status

__all__ = ["PublishJob", "PublishStatus", "publish", "publisher_argv", "publisher_env"]

try:
    import resource
except ImportError:  # pragma: no cover - not Unix: no decoding processes' CPU time
    resource = None  # type: ignore[assignment]


def _cpu_seconds() -> float:
    """This process's CPU time since it was forked (across ``exec``), its ended children's included."""
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
    """Publish the job named on the command line; the outcome goes to ``--status-fd``."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    parser = argparse.ArgumentParser(prog="python -m torchprof_args.runtime.export.publisher",
                                     description="Publish one staged trace (started by TorchProfiler).")
    parser.add_argument("job")
    parser.add_argument("--staging", action="append", required=True, help="a staging directory (repeatable)")
    parser.add_argument("--output", required=True, help="the output directory")
    parser.add_argument("--status-fd", type=int, default=None)
    parser.add_argument("--priority", choices=PRIORITIES, default=NORMAL,
                        help="idle: lower this process to the lowest CPU and I/O priority "
                             "(--torch-profile-publisher-priority); normal (default): leave it as it is")
    parser.add_argument("--export-cpu", type=float, default=0.0,
                        help="CPU seconds this process spent exporting before it became the publisher")
    args = parser.parse_args(argv)
    if args.priority == IDLE:
        for skipped in lower_to_background():  # TORCHPROF_LOG_LEVEL=DEBUG shows what this platform lacks
            get_logger(__name__).debug("publisher priority not lowered: %s", skipped)
    return run_job(args.job, args.staging, args.output, args.status_fd, export_cpu=args.export_cpu)


def run_job(job_path: str, staging: list[str], output: str, status_fd: int | None, *,
            export_cpu: float = 0.0) -> int:
    """Check and publish the job file ``job_path`` (its files within ``staging`` and ``output``), report
    on ``status_fd``; returns the exit code.  The publisher's ``main``, and a fork server's worker.

    ``export_cpu``: CPU seconds this process spent exporting the trace first (the forked exporter
    that ``exec``'d this publisher), kept apart in the status.
    """
    try:
        job = PublishJob.load(job_path, staging, output)
    except JobRejected as err:
        report_status(status_fd, PublishStatus(error=f"publisher rejected the job: {err}"))
        print(f"torchprof publisher: {err}", file=sys.stderr)
        return EXIT_REJECTED
    status = PublishStatus(trace_path=job.trace_path, rank=job.rank, error="publisher terminated")
    try:
        cpu = PublishCpu(export=export_cpu, start=_cpu_seconds() - export_cpu)
        status = publish(job, cpu=cpu)
        get_logger(__name__).debug(
            "rank %d: publisher of %s: %.3f s CPU: %.3f exporting, %.3f starting (interpreter, imports), "
            "%.3f the trace (%s), %.3f its summary, %.3f extra files; the export took %.3f s of CPU, the "
            "exporter's memory categorisation %.3f", job.rank, job.trace_path, cpu.total, cpu.export,
            cpu.start, cpu.trace, status.compressor, cpu.summary, cpu.extra, job.export_seconds or 0.0,
            job.categorisation_spent)
    finally:
        report_status(status_fd, status)
        with contextlib.suppress(OSError):
            os.unlink(job_path)
    return 0 if status.published else EXIT_PUBLISH_FAILED


def publisher_argv(job_path: str, staging_dirs: list[str], output_dir: str,
                   status_fd: int | None, priority: str = IDLE) -> list[str]:
    """The command line that starts a publisher for ``job_path`` (at ``priority``, see
    :mod:`~torchprof_args.runtime.export.priority`)."""
    argv = [sys.executable, "-m", __name__, job_path, "--output", output_dir, "--priority", priority]
    for directory in staging_dirs:
        argv += ["--staging", directory]
    return argv + (["--status-fd", str(status_fd)] if status_fd is not None else [])


def publisher_env() -> dict[str, str]:
    """The training process's environment, with this package importable for sure."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


if __name__ == "__main__":
    sys.exit(main())
