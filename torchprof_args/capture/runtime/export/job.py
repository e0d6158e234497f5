"""One publish job: what the training process tells the rank's publisher, and the checks before it is trusted.

The training process sends each job as one JSON line on the publisher's stdin; a forked exporter
hands its job back (with the export's CPU time) in a job file in the rank's private staging directory
(written atomically, mode 0600), read only if it is a regular file of this user writable by no one
else.  The publisher is started with the staging and output directories on its command line and
accepts a job only if every staged file lies directly in one of those staging directories and every
published file lies inside that output directory (symlinks resolved), so a planted or edited job
cannot make it read or overwrite anything else.

Outcomes travel back as :class:`~torchprof_args.capture.runtime.export.status.PublishStatus` lines.

Import-light (the publisher imports it): no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Iterable
from pathlib import Path

import msgspec

from torchprof_args.atomic import partial_path, write_json_atomically
from torchprof_args.capture.runtime import flags
from torchprof_args.time_limit import Deadline

__all__ = [
    "EXIT_EXPORT_FAILED",
    "MIN_ANALYSIS_SECONDS",
    "JobRejected",
    "PublishJob",
]

#: The forked exporter's exit code when its export failed, so the training process can name the
#: reason even when no status came back.
EXIT_EXPORT_FAILED = 3
#: the least CPU time a trace's analyses are given whatever its export took: the summary, diagnosis
#: and critical path of a trace of a few MB take ~0.3 s in a warm publisher (a faster export must not
#: cost a small trace its sidecar).
MIN_ANALYSIS_SECONDS = 1.0


class JobRejected(ValueError):
    """A job file that the publisher refuses to act on (one sentence: which path and why)."""


@dataclasses.dataclass
class PublishJob:
    """Everything the publisher process needs, saved to the job file as JSON.

    ``extra_files`` is the place for more files published with this trace (an execution trace):
    ``(staged path, target path, gzip level or None)`` each; the publisher moves them into the
    output directory after the trace, atomically, and removes them from staging.  The operator
    table and the summary sidecar are parsed from the staged trace by the publisher itself.
    """

    staged_path: str
    trace_path: str
    gzip_level: int | None = flags.GZIP_LEVEL.default
    #: the trace's operator table (``naming.operator_table_path``), ``operator_table_rows`` operators.
    operator_table_path: str | None = None
    operator_table_rows: int = flags.OPERATOR_TABLE_ROWS.default
    rank: int = 0
    extra_files: list[tuple[str, str, int | None]] = dataclasses.field(default_factory=list)
    #: the trace's summary sidecar (``naming.sidecar_path``), written with the operator table.
    sidecar_path: str | None = None
    #: a staged file the forked exporter writes with PyTorch's memory categorisation of the window
    #: (:mod:`torchprof_args.analysis.memory.exported`), kept in the sidecar by the publisher.
    memory_path: str | None = None
    #: ``--torch-profile-analysis-budget``: the share of the export's CPU time the trace's analyses may
    #: take in CPU (0: no budget); ``export_seconds``: that CPU time, measured where it was exported.
    analysis_budget: float = 0.0
    export_seconds: float | None = None
    #: CPU seconds the exporter spent on PyTorch's memory categorisation (for the publisher's log).
    categorisation_spent: float = 0.0

    def analysis_seconds(self) -> float | None:
        """The CPU seconds the publisher's analyses of the trace may take (decoding, then the
        sidecar's parts), None for no limit: the budget's share of the export's CPU time, at least
        :data:`MIN_ANALYSIS_SECONDS`."""
        if not self.analysis_budget or self.export_seconds is None:
            return None
        return max(MIN_ANALYSIS_SECONDS, self.analysis_budget * self.export_seconds)

    def categorisation_seconds(self) -> float | None:
        """The CPU seconds the exporter may spend on PyTorch's memory categorisation, before the
        publisher starts: half of :meth:`analysis_seconds` (its cost is ~60x the export's: on a large
        first window it rarely fits, and it must not cost the sidecar its diagnosis)."""
        total = self.analysis_seconds()
        return None if total is None else total / 2

    def analysis_deadline(self) -> Deadline:
        """The publisher's deadline (:meth:`analysis_seconds` of CPU from now), described for the
        sidecar's ``left_out``."""
        total = self.analysis_seconds()
        if total is None:
            return Deadline(None)
        return Deadline(total, f"the trace's analysis budget ({self.analysis_budget:g} x its export's "
                               f"{self.export_seconds or 0.0:.2f} s, at least {MIN_ANALYSIS_SECONDS:g} s: "
                               f"{total:.2f} s of CPU; --torch-profile-analysis-budget)")

    def save(self, job_path: str | os.PathLike[str]) -> None:
        write_json_atomically(job_path, dataclasses.asdict(self), private=True)

    def encode(self) -> bytes:
        """The job as one line of JSON (the publisher's input)."""
        return msgspec.json.encode(self) + b"\n"

    @classmethod
    def decode(cls, line: bytes, staging_dirs: Iterable[str], output_dir: str) -> PublishJob:
        """A job line, checked (see the module docstring); raises :class:`JobRejected`."""
        try:
            job = msgspec.json.decode(line, type=cls)  # the fields' types checked too
        except ValueError as err:
            raise JobRejected(f"job cannot be read: {err}") from None
        job.check(staging_dirs, output_dir)
        return job

    @classmethod
    def load(cls, job_path: str | os.PathLike[str], staging_dirs: Iterable[str],
             output_dir: str) -> PublishJob:
        """Read and check a job file (see the module docstring); raises :class:`JobRejected`."""
        staging = [os.path.realpath(d) for d in staging_dirs]
        _check_job_file(job_path, staging)
        try:
            fd = os.open(job_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with open(fd, "rb") as handle:
                data = handle.read()
        except OSError as err:
            raise JobRejected(f"job file {job_path} cannot be read: {err}") from None
        try:
            return cls.decode(data, staging, output_dir)
        except JobRejected as err:
            raise JobRejected(f"job file {job_path}: {err}") from None

    def check(self, staging_dirs: Iterable[str], output_dir: str) -> None:
        """Raise :class:`JobRejected` unless every staged file lies directly in one of ``staging_dirs``
        and every published file inside ``output_dir``."""
        staging = [os.path.realpath(d) for d in staging_dirs]
        for path in self.staged_files():
            _require_in(path, staging, "staged file", directly=True)
        output = os.path.realpath(output_dir)
        for path in self.published_files():
            _require_in(path, [output], "published file", directly=False)

    def staged_files(self) -> list[str]:
        return [self.staged_path, *(staged for staged, _, _ in self.extra_files),
                *([self.memory_path] if self.memory_path else [])]

    def published_files(self) -> list[str]:
        files = [self.trace_path, *(target for _, target, _ in self.extra_files)]
        return files + [p for p in (self.operator_table_path, self.sidecar_path) if p]

    def remove_leftovers(self, job_path: str | os.PathLike[str] | None = None) -> None:
        """Remove the job file and every file the trace's processes may have left behind."""
        for path in ([Path(job_path)] if job_path else []) + self.leftovers():
            with contextlib.suppress(OSError):
                path.unlink()

    def leftovers(self) -> list[Path]:
        """Every file this job may leave if its processes die: staged files and their hidden partial
        names (plus Kineto's ``.tmp``), and the hidden partial names in the output directory."""
        files: list[Path] = []
        for staged in self.staged_files():
            partial = partial_path(staged)
            files += [Path(staged), partial, partial.with_name(partial.name + ".tmp")]
        return files + [partial_path(p) for p in self.published_files()]


def _check_job_file(job_path: str | os.PathLike[str], staging: list[str]) -> None:
    _require_in(str(job_path), staging, "job file", directly=True)
    try:
        info = os.lstat(job_path)
    except OSError as err:
        raise JobRejected(f"job file {job_path} cannot be read: {err}") from None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise JobRejected(f"job file {job_path} is not a regular file of uid {os.getuid()} writable only "
                          "by it")


def _require_in(path: str, directories: list[str], what: str, *, directly: bool) -> None:
    resolved = os.path.realpath(path)
    parent = os.path.dirname(resolved)
    inside = any(parent == d if directly else (parent == d or parent.startswith(d.rstrip("/") + "/"))
                 for d in directories)
    if not inside:
        where = " or ".join(directories)
        raise JobRejected(f"{what} {path} lies outside {where}, the directories this publisher was started "
                          "for")
