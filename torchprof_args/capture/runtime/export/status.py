"""The outcome of one publish job, as it travels back to the training process.

The rank's publisher answers each job with one :class:`PublishStatus` JSON line on its stdout; a
forked exporter whose export failed writes one on its status pipe, read once it has exited.
Outcomes travel on pipes, not in files: a full staging filesystem cannot eat them.

Import-light (the publisher and the forked child use it): no torch.
"""

from __future__ import annotations

import contextlib
import os
import signal

import msgspec

__all__ = ["PublishCpu", "PublishStatus", "ended_how", "read_status", "report_status"]

#: One write below PIPE_BUF (4096): atomic, never blocks on an unread pipe.
STATUS_LIMIT = 3500
#: What a too long status keeps of each message (and of the lists, how many items).
_SHORT_TEXT = 500
_SHORT_LIST = 3


class PublishCpu(msgspec.Struct, omit_defaults=True):
    """The CPU seconds (user + system) of one publication's process, by phase.

    What competes with training after a flush (``benchmarks/bench_window_cost.py``);
    ``TORCHPROF_LOG_LEVEL=DEBUG`` logs it and ``prof.stats["publish_cpu_seconds"]`` has the last total.
    """

    #: The forked exporter's serialisation (``fork`` mode).
    export: float = 0.0
    #: The publisher's CPU time before this job since its last one: for its first job, its
    #: interpreter and imports (paid once per publisher).
    start: float = 0.0
    #: Compressing and writing the trace.
    trace: float = 0.0
    #: The summary sidecar and operator table: their imports, decoding the trace (decoding
    #: processes included), computing and writing them.
    summary: float = 0.0
    #: Extra files (an execution trace).
    extra: float = 0.0

    @property
    def total(self) -> float:
        return self.export + self.start + self.trace + self.summary + self.extra


class PublishStatus(msgspec.Struct, omit_defaults=True):
    """What became of one trace: published (``error`` None) or not, and the figures the writer keeps.

    The publisher fills it in step by step.

    ``publish_seconds`` is what ``TraceWriter.stats`` (:mod:`~torchprof_args.capture.runtime.export.writer`)
    reports under the same name (``profiler/publish_seconds`` on the dashboards).
    """

    #: Where the trace is (being) published; "" when the publisher rejected its job unread.
    trace_path: str = ""
    rank: int | None = None
    #: Why the trace was not published; None: it was.
    error: str | None = None
    #: The staged (uncompressed) trace's size: sizes the next export's memory estimate.
    raw_mb: float | None = None
    #: The published (compressed) trace's size.
    trace_mb: float | None = None
    #: Seconds until the trace itself was in place (compressed, renamed).
    trace_seconds: float | None = None
    #: Seconds the whole job took: the trace, its summary sidecar and operator table, extra files.
    publish_seconds: float = 0.0
    #: The operator table written beside the trace's summary sidecar.
    operator_table_path: str | None = None
    #: The trace is published, but its summary sidecar / operator table failed: why.
    summary_error: str | None = None
    #: Parts of the sidecar left out (over the analysis budget), each with why.
    left_out: dict[str, str] = msgspec.field(default_factory=dict)
    #: Extra files published with the trace (an execution trace), and why others were not.
    extra_files: list[str] = msgspec.field(default_factory=list)
    extra_errors: list[str] = msgspec.field(default_factory=list)
    #: The publisher process's CPU time by phase; None when published in the training process.
    cpu: PublishCpu | None = None
    #: What compressed the trace: ``"isal 1"``, ``"zlib 6"``, ``"copy 0"`` (not compressed).
    compressor: str | None = None

    @property
    def published(self) -> bool:
        return self.error is None


_DECODER = msgspec.json.Decoder(PublishStatus)


def report_status(fd: int | None, status: PublishStatus) -> None:
    """Send the outcome to the training process (one write on the status pipe; never raises)."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, _encode_within_limit(status) + b"\n")


def _encode_within_limit(status: PublishStatus) -> bytes:
    """``status`` as JSON of at most :data:`STATUS_LIMIT` bytes: long messages and lists shortened."""
    data = msgspec.json.encode(status)
    if len(data) <= STATUS_LIMIT:
        return data
    for limit in (_SHORT_TEXT, _SHORT_TEXT // 5):
        status = _shortened(status, limit)
        data = msgspec.json.encode(status)
        if len(data) <= STATUS_LIMIT:
            return data
    # paths longer than the pipe can carry: the outcome alone
    return msgspec.json.encode(PublishStatus(rank=status.rank, error=status.error and status.error[:200],
                                             publish_seconds=status.publish_seconds))


def _shortened(status: PublishStatus, limit: int) -> PublishStatus:
    def cut(text: str | None) -> str | None:
        return text if text is None or len(text) <= limit else text[:limit] + "..."

    def cut_list(items: list[str]) -> list[str]:
        kept = [text[:limit] for text in items[:_SHORT_LIST]]
        return kept + ([f"... and {len(items) - _SHORT_LIST} more"] if len(items) > _SHORT_LIST else [])

    return msgspec.structs.replace(status, error=cut(status.error), summary_error=cut(status.summary_error),
                                   extra_files=cut_list(status.extra_files),
                                   extra_errors=cut_list(status.extra_errors))


def read_status(fd: int) -> PublishStatus | None:
    """The last complete status on the pipe, once the writer has exited (non-blocking)."""
    chunks = []
    with contextlib.suppress(OSError):
        os.set_blocking(fd, False)
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    for line in reversed(b"".join(chunks).splitlines()):
        with contextlib.suppress(msgspec.DecodeError):  # ValidationError is one
            return _DECODER.decode(line)
    return None


def ended_how(code: int | None) -> str:
    """How a process with exit code ``code`` (``os.waitstatus_to_exitcode``'s; None: unknown) ended."""
    if code is None:
        return "ended"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
