"""The forked exporter: serialise a stopped profiler's trace outside the training process.

``export_chrome_trace`` holds the GIL for the whole serialisation (minutes for a large trace),
so a thread cannot hide it.  The training process forks instead; the child (only the forking
thread exists there) exports to staging, then ``exec``\\ s the publisher so that no inherited
state (locks, sockets, CUDA) lingers.  The child never returns into the caller's code.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from torchprof_args.atomic import partial_path
from torchprof_args.runtime.export.publisher import PublishJob, publisher_argv, publisher_env

__all__ = ["fork_export"]


def fork_export(export: Callable[[str], None], job: PublishJob, job_path: str) -> int:
    """Fork; the child exports ``job`` via ``export(path)`` and becomes its publisher.  Returns the child's pid."""
    argv, env = publisher_argv(job_path), publisher_env()
    staged_tmp = str(partial_path(job.staged_path))
    pid = os.fork()
    if pid:
        return pid
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


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 65536
