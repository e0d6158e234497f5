"""The rank's publisher's loop, run here over job lines (what ``publisher.serve`` does in its process)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import msgspec

from torchprof_args.capture.runtime.export import publisher
from torchprof_args.capture.runtime.export.job import PublishJob
from torchprof_args.capture.runtime.export.status import PublishStatus


def served(staging: Path, output: Path, *jobs: PublishJob | bytes) -> list[PublishStatus]:
    """Publish ``jobs`` (jobs, or raw lines) as the publisher of ``staging`` and ``output`` would, in
    this process; its answers, one per job."""
    read, write = os.pipe()
    os.write(write, b"".join(job if isinstance(job, bytes) else job.encode() for job in jobs))
    os.close(write)
    replies = io.BytesIO()
    try:
        assert publisher.serve(read, replies, [str(staging)], str(output)) == 0
    finally:
        os.close(read)
    return [msgspec.json.decode(line, type=PublishStatus) for line in replies.getvalue().splitlines()]
