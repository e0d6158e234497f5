"""The one answer to "which rank am I, and how many are there?".

Import-light: ``torch.distributed`` is consulted only when something already imported it, so
``import torchprof_args`` and the ``torchprof`` commands never pull torch in.  Without an
initialised process group the launcher's environment (``RANK``/``WORLD_SIZE``, as torchrun and
most launchers set them) answers, else a single process is assumed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: this module never imports torch
    from torch.distributed import ProcessGroup, Work

__all__ = [
    "dist_if_initialized", "env_int", "rank", "unrecorded", "wait", "world_size", "world_size_if_known",
]


def dist_if_initialized() -> ModuleType | None:
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


def world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks (of ``group`` when given): the process group's, else ``$WORLD_SIZE``, else 1."""
    known = world_size_if_known(group)
    return 1 if known is None else known


def world_size_if_known(group: ProcessGroup | None = None) -> int | None:
    """Like :func:`world_size`, but None when neither a process group nor ``$WORLD_SIZE`` says."""
    dist = dist_if_initialized()
    if dist is not None:
        return dist.get_world_size(group)
    return env_int("WORLD_SIZE")


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Keep the profiler's own collectives out of the user's trace.

    Votes and decisions that torchprof-args exchanges inside a recording window would otherwise
    appear as ``gloo:all_reduce`` / ``c10d::broadcast_`` events of the job, and skew what
    ``torchprof collectives`` reports.  Record functions are switched off on this thread (gloo
    creates its worker-thread event from the caller's) for the duration of the block.
    """
    autograd = getattr(getattr(sys.modules.get("torch"), "_C", None), "_autograd", None)
    switch = getattr(autograd, "_enable_record_function", None)
    if switch is None:
        yield
        return
    switch(False)
    try:
        yield
    finally:
        switch(True)


def wait(work: Work, timeout: float | None = None) -> None:
    """Wait for an asynchronous collective of ours (``timeout`` seconds, or its group's), unrecorded."""
    with unrecorded():
        if timeout is None:
            work.wait()
        else:
            import datetime

            work.wait(datetime.timedelta(seconds=timeout))
