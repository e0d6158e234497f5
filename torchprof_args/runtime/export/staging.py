"""Node-local staging: where a raw trace is written before the publisher compresses it away.

``/dev/shm`` (RAM) when it has room, else ``$TMPDIR``; one private directory per process:
``<base>/torchprof-<uid>/pid<pid>``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

__all__ = ["STAGING_MIN_FREE_BYTES", "choose_staging_dir"]

#: /dev/shm is used for staging only when it has at least this much room.
STAGING_MIN_FREE_BYTES = 4 << 30


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
