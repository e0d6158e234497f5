"""``metrics.jsonl``, as the job writes it (``metrics/sinks.py``) and the tools read it (``torchprof
goodput | trend | dashboard``, the Prometheus sink's goodput window).

One JSON object per line and per log interval: ``iteration``, ``timestamp`` (seconds since the
epoch), ``metrics`` (key -> number) and, when ranks were gathered, ``per_rank`` (key -> one value
per rank, null where a rank has none).  Each process that writes the file marks where it starts,
that it is alive while it writes nothing, and where it ends, so that successive runs appended to one
directory (a job restarted from a checkpoint) can be told apart and timed.

Three kinds of marker line, each a valid metrics record (``iteration``, ``timestamp``, empty
``metrics``) with one more key, so a reader that knows nothing of markers merges them harmlessly:

* ``"run"``: written when the metrics writer starts: the run's ``id``, its process's start time
  (``process_start``, seconds since the epoch: ``/proc/self/stat`` on Linux), the writer's start
  (``writer_start``: the first interval is measured from there), ``start_iteration`` (the
  checkpoint it resumed from), world size, host and pid;
* ``"alive"``: written by a daemon thread after :data:`ALIVE_SECONDS` without any line, so a process
  that hangs and is killed still says until when it lived;
* ``"run_end"``: written when the writer closes (or at interpreter exit).

:func:`read_runs` splits a file into :class:`RunSegment` s (lines before any marker, written by an
older version, form one segment without a marker) of typed :class:`MetricsRecord` s;
:func:`read_records` gives the records alone, one per iteration.  A run marker of a newer format
than ``formats.METRICS_RUN.version`` is refused in one line naming the file and line: upgrade the reader.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from torchprof_args.shared import formats

__all__ = [
    "ALIVE_KEY",
    "ALIVE_SECONDS",
    "END_KEY",
    "MARKER_KEYS",
    "RUN_KEY",

    "MetricsRecord",
    "RunMarker",
    "RunSegment",
    "marker_line",
    "process_start_time",
    "read_records",
    "read_runs",
]

RUN_KEY = "run"
END_KEY = "run_end"
ALIVE_KEY = "alive"
MARKER_KEYS = (RUN_KEY, END_KEY, ALIVE_KEY)
#: Seconds without a line after which the writer's thread says the process is alive.
ALIVE_SECONDS = 30.0


class MetricsRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One log interval's line: the ``iteration`` it ends at, when it was written (``timestamp``,
    seconds since the epoch), the figures (``metrics``: key -> number, reduced over ranks) and, when
    ranks were gathered, ``per_rank`` (key -> one value per rank, None where a rank has none)."""

    iteration: int
    timestamp: float
    metrics: dict[str, float]
    per_rank: dict[str, list[float | None]] = {}

    def to_line(self) -> dict[str, Any]:
        """The record as the line's JSON object (the values as given: a float subclass such as
        numpy's float64 stays one for ``json``)."""
        line: dict[str, Any] = {"iteration": self.iteration, "timestamp": self.timestamp,
                                "metrics": dict(self.metrics)}
        if self.per_rank:
            line["per_rank"] = {key: list(values) for key, values in self.per_rank.items()}
        return line


def process_start_time() -> float | None:
    """When this process started, seconds since the epoch (Linux: ``/proc``; None elsewhere)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime, clock ticks after boot
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


@dataclasses.dataclass(frozen=True)
class RunMarker:
    """What the ``"run"`` line says about one process writing metrics."""

    id: str
    writer_start: float
    start_iteration: int
    process_start: float | None = None
    world_size: int = 1
    host: str = ""
    pid: int = 0

    @classmethod
    def here(cls, start_iteration: int, world_size: int, writer_start: float | None = None) -> RunMarker:
        """The marker of this process, whose writer starts now (or at ``writer_start``)."""
        return cls(
            id=uuid.uuid4().hex[:12],
            writer_start=time.time() if writer_start is None else writer_start,
            start_iteration=start_iteration,
            process_start=process_start_time(),
            world_size=world_size,
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    def record(self) -> dict[str, Any]:
        """The ``"run"`` line."""
        return {
            "iteration": self.start_iteration,
            "timestamp": self.writer_start,
            "metrics": {},
            RUN_KEY: {"version": formats.METRICS_RUN.version, **dataclasses.asdict(self)},
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> RunMarker:
        """The marker of a ``"run"`` line's object (keys it does not know are left out)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in fields})


def marker_line(key: str, run_id: str, iteration: int, timestamp: float | None = None) -> dict[str, Any]:
    """An ``"alive"`` or ``"run_end"`` line of run ``run_id``."""
    return {
        "iteration": iteration,
        "timestamp": time.time() if timestamp is None else timestamp,
        "metrics": {},
        key: {"id": run_id},
    }


@dataclasses.dataclass
class RunSegment:
    """One process's lines: its marker (None for lines written before markers existed), its
    metrics records in file order, when it closed (``end``, None if it never did: killed) and the
    last moment it is known to have been alive."""

    marker: RunMarker | None
    records: list[MetricsRecord] = dataclasses.field(default_factory=list)
    end: float | None = None
    last_alive: float | None = None

    @property
    def start(self) -> float | None:
        """The process's start, else its writer's, else its first record's time."""
        if self.marker is not None:
            return self.marker.process_start or self.marker.writer_start
        return self.records[0].timestamp if self.records else None

    @property
    def finish(self) -> float | None:
        """The last moment of this process the file knows about."""
        return self.end if self.end is not None else self.last_alive


class _Marker(msgspec.Struct):
    id: str = ""


class _Line(msgspec.Struct):
    """Any line of the file: a record, or a marker (a record with one more key)."""

    iteration: int
    timestamp: float
    metrics: dict[str, float] = {}
    per_rank: dict[str, list[float | None]] = {}
    run: dict[str, Any] | None = None
    run_end: _Marker | None = None
    alive: _Marker | None = None


_decode_line = msgspec.json.Decoder(_Line)


def _lines(path: Path) -> list[tuple[int, _Line]]:
    """The file's lines, numbered and decoded.  A truncated last line (a crash mid-write) is skipped;
    any other bad line, or a run of a newer format, is a ``ValueError`` naming the file and line."""
    with open(path, "rb") as handle:
        raw = handle.readlines()
    lines = []
    for number, text in enumerate(raw, start=1):
        if not text.strip():
            continue
        try:
            line = _decode_line.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            if number == len(raw) and not text.endswith(b"\n"):
                continue
            raise ValueError(f"{path}:{number}: not a metrics record ({err}).") from None
        version = line.run.get("version", 1) if line.run is not None else 1
        if not isinstance(version, int) or version > formats.METRICS_RUN.version:
            raise ValueError(f"{path}:{number}: a run of metrics.jsonl format {version!r}, newer than this "
                             f"torchprof-args reads ({formats.METRICS_RUN.version}): upgrade torchprof-args "
                             "to read it.")
        lines.append((number, line))
    return lines


def _record(line: _Line) -> MetricsRecord:
    return MetricsRecord(line.iteration, line.timestamp, line.metrics, line.per_rank)


def read_runs(path: str | os.PathLike[str]) -> list[RunSegment]:
    """The runs of a ``metrics.jsonl`` in file order.  A truncated last line (a crash mid-write) is
    skipped; any other bad line is a ``ValueError`` naming the file and line."""
    segments: list[RunSegment] = []
    current: RunSegment | None = None
    for _, line in _lines(Path(path)):
        if line.run is not None:
            current = RunSegment(RunMarker.from_doc(line.run), last_alive=line.timestamp)
            segments.append(current)
            continue
        if current is None:
            current = RunSegment(None)
            segments.append(current)
        current.last_alive = max(current.last_alive or line.timestamp, line.timestamp)
        if line.run_end is not None:
            current.end = line.timestamp
        elif line.alive is None:
            current.records.append(_record(line))
    return segments


def read_records(path: str | os.PathLike[str]) -> list[MetricsRecord]:
    """The records of a ``metrics.jsonl`` (no markers), one per iteration, in iteration order: a
    later record of an iteration (a restarted run) wins, its figures merged over the earlier one's.
    Bad lines as :func:`read_runs`."""
    by_iteration: dict[int, MetricsRecord] = {}
    for _, line in _lines(Path(path)):
        if line.run is not None or line.run_end is not None or line.alive is not None:
            continue
        record = _record(line)
        previous = by_iteration.get(record.iteration)
        if previous is not None:
            record = msgspec.structs.replace(record, metrics={**previous.metrics, **record.metrics})
        by_iteration[record.iteration] = record
    return [by_iteration[i] for i in sorted(by_iteration)]
