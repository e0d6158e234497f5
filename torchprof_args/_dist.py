"""The one answer to "which rank am I, and how many are there?".

Import-light: ``torch.distributed`` is consulted only when something already imported it, so
``import torchprof_args`` and the ``torchprof`` commands never pull torch in.  Without an
initialised process group the launcher's environment (``RANK``/``WORLD_SIZE``, as torchrun and
most launchers set them) answers, else a single process is assumed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["dist_if_initialized", "env_int", "rank", "world_size", "world_size_if_known"]


def dist_if_initialized() -> Any:
    """``torch.distributed`` when a default process group exists, else None (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except (RuntimeError, ValueError):
        pass
    return None


def env_int(name: str) -> int | None:
    """An environment variable holding a whole number, else None."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def rank() -> int:
    """The global rank: the process group's, else ``$RANK``, else 0."""
    dist = dist_if_initialized()
    if dist is not None:
        return dist.get_rank()
    found = env_int("RANK")
    return 0 if found is None else found


def world_size(group: Any = None) -> int:
    """The number of ranks (of ``group`` when given): the process group's, else ``$WORLD_SIZE``, else 1."""
    known = world_size_if_known(group)
    return 1 if known is None else known


def world_size_if_known(group: Any = None) -> int | None:
    """Like :func:`world_size`, but None when neither a process group nor ``$WORLD_SIZE`` says."""
    dist = dist_if_initialized()
    if dist is not None:
        return dist.get_world_size(group)
    return env_int("WORLD_SIZE")
