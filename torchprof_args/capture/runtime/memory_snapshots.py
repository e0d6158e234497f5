"""CUDA memory snapshots: allocator history dumped per rank at profiled cycles, intervals and OOM.

``--torch-profile-memory-snapshot`` turns on ``torch.cuda.memory._record_memory_history`` (Python
stacks by default: C++ symbolisation of every allocation can take minutes at dump time) and
dumps ``torch.cuda.memory._snapshot()`` as a pickle (protocol 4) that pytorch.org/memory_viz
(and ``torchprof mem``) read.  Files are written to a temporary name and renamed, so a reader
never sees half a snapshot:

    <profile dir>/memory_snapshots/memory_snapshot_<host>_rank<R>_iter<I>[_oom].pickle

Import-light: torch is imported when a snapshotter is created.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import pickle
import socket
import sys
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

from torchprof_args import _dist
from torchprof_args.atomic import atomic_output
from torchprof_args.capture.runtime.config import MemorySnapshotConfig
from torchprof_args.log import get_logger
from torchprof_args.naming import memory_snapshot_name

__all__ = ["MemorySnapshotter", "write_snapshot"]

logger = get_logger(__name__)

_DUMPED_MARK = "_torchprof_memory_snapshot_written"

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


def write_snapshot(snapshot: object, path: str) -> None:
    """Pickle ``snapshot`` (``torch.cuda.memory._snapshot()``'s dict; protocol 4) to ``path`` atomically."""
    with atomic_output(path, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=4)


def _torch_cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


class _Guard(contextlib.ContextDecorator):
    """Dumps a snapshot when ``torch.OutOfMemoryError`` escapes the block, then re-raises it."""

    def __init__(self, owner: MemorySnapshotter, iteration: int | None) -> None:
        self._owner = owner
        self._iteration = iteration

    def __enter__(self) -> _Guard:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc is not None and self._owner._is_oom(exc) and not getattr(exc, _DUMPED_MARK, False):
            iteration = self._iteration if self._iteration is not None else self._owner.next_iteration
            self._owner.on_oom(iteration)
            with contextlib.suppress(AttributeError):
                setattr(exc, _DUMPED_MARK, True)  # nested guards dump once
        return False  # never swallow the error


class MemorySnapshotter:
    """Records CUDA allocator history and dumps per-rank snapshots.

    Hooks (the profiler calls them on the ranks it traces):

    * ``start()``: begin recording allocator history (call once, before training).
    * ``on_step(iteration, profiled_cycle_ended)``: after ``iteration`` has finished.  Dumps when
      a profiled (recorded) cycle ended with this iteration, or every ``interval`` iterations.
    * ``guard(iteration=None)``: context manager / decorator around a training step; on
      ``torch.OutOfMemoryError`` it dumps ``..._oom.pickle`` and re-raises the error.
      ``on_oom(iteration)`` does the dump directly.
    * ``close()``: stop recording.

    Without CUDA, one warning (with the rank) and nothing else.

    Args:
        config: the ``--torch-profile-memory-snapshot*`` flags' config.
        rank: this rank (default: the process group's); ``host``: in the file names (default: this one).
        snapshot_fn, record_fn, cuda_available: default to the real torch calls; they exist so that
            the dump path can be tested where there is no GPU.

    Raises:
        ValueError: ``config.stacks`` is neither ``python`` nor ``all``.
    """

    def __init__(
        self,
        config: MemorySnapshotConfig,
        *,
        rank: int | None = None,
        host: str | None = None,
        snapshot_fn: Callable[[], object] | None = None,
        record_fn: Callable[..., object] | None = None,
        cuda_available: bool | None = None,
    ) -> None:
        if config.stacks not in ("python", "all"):
            raise ValueError("--torch-profile-memory-snapshot-stacks must be 'python' or 'all', "
                             f"got {config.stacks!r}")
        self.config = config
        self.output_dir = config.output_dir
        self.interval = config.interval
        self.rank = _dist.rank() if rank is None else rank
        self.host = host or socket.gethostname()
        self.enabled = config.enabled
        self.recording = False
        self.next_iteration = 0
        self.written: list[str] = []
        self._snapshot_fn = snapshot_fn
        self._record_fn = record_fn
        self._cuda_available = cuda_available
        self._checked = False

    @classmethod
    def from_args(cls, args: argparse.Namespace, **kwargs: Any) -> MemorySnapshotter:
        """A snapshotter for the ``--torch-profile-memory-snapshot*`` flags, for your own loop
        (:class:`~torchprof_args.TorchProfiler` makes its own on the ``--torch-profile-ranks``).

        Args:
            args: the parsed namespace (checked here).
            kwargs: the constructor's other arguments.

        Returns:
            The snapshotter; snapshots go to ``<--torch-profile-dir or --tensorboard-dir or
            ./prof>/memory_snapshots``.
        """
        from torchprof_args.capture.config import configs_from_args

        return cls(configs_from_args(args).profiler.memory, **kwargs)

    # -----------------------------------------------------------------------------------------

    def usable(self) -> bool:
        """Whether snapshots can be taken: enabled and CUDA present (warns once, with the rank, when CUDA is
        missing).

        Returns:
            True when the hooks do something.
        """
        if not self.enabled:
            return False
        if not self._checked:
            self._checked = True
            available = _torch_cuda_available() if self._cuda_available is None else self._cuda_available
            if not available:
                logger.warning(
                    "--torch-profile-memory-snapshot needs CUDA, which is not available on rank %d: "
                    "no memory history is recorded and no snapshots are written.", self.rank)
                self.enabled = False
                return False
        return True

    def start(self) -> None:
        """Begin recording allocator history (alloc/free events with their stacks)."""
        if not self.usable() or self.recording:
            return
        record = self._record_fn
        if record is None:
            import torch

            record = torch.cuda.memory._record_memory_history
        record(enabled="all", context="all", stacks=self.config.stacks, max_entries=self.config.max_entries)
        self.recording = True
        logger.info("recording CUDA memory history (%s stacks, up to %d events) -> %s",
                    self.config.stacks, self.config.max_entries, self.output_dir)

    def on_step(self, iteration: int, profiled_cycle_ended: bool = False) -> str | None:
        """Call after an iteration finished: dumps when it is due.

        Args:
            iteration: the iteration that finished.
            profiled_cycle_ended: a recorded cycle ended with it (dump now).

        Returns:
            The snapshot written, if any.
        """
        self.next_iteration = iteration + 1
        if not self.usable():
            return None
        due = profiled_cycle_ended or (self.interval > 0 and iteration > 0 and iteration % self.interval == 0)
        return self.dump(iteration) if due else None

    def on_oom(self, iteration: int) -> str | None:
        """Dump ``..._oom.pickle`` now; never raises (the out-of-memory error is what matters).

        Args:
            iteration: the iteration that ran out of memory.

        Returns:
            The snapshot written, if any.
        """
        if not self.usable():
            return None
        return self.dump(iteration, reason="oom")

    def guard(self, iteration: int | None = None) -> _Guard:
        """``with snapshotter.guard(it): train_step()`` or ``@snapshotter.guard()``: dumps a snapshot if
        ``torch.OutOfMemoryError`` escapes, then re-raises it.

        Args:
            iteration: the step it guards (default: the one after the last :meth:`on_step`).

        Returns:
            The guard (a context manager and a decorator).
        """
        return _Guard(self, iteration)

    def wrap(self, step_fn: Callable[_Params, _Result]) -> Callable[_Params, _Result]:
        """A training-step function with :meth:`guard` around every call.

        Args:
            step_fn: the function.

        Returns:
            The wrapped function (same signature).
        """

        @functools.wraps(step_fn)
        def wrapped(*args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
            with self.guard():
                return step_fn(*args, **kwargs)

        return wrapped

    def dump(self, iteration: int, reason: str | None = None) -> str | None:
        """Write one snapshot now; errors are logged, never raised into training.

        Args:
            iteration: in the file name.
            reason: a suffix of the file name (``oom``), or None.

        Returns:
            The snapshot's path; None when it could not be written or snapshots are off.
        """
        if not self.usable():
            return None
        path = os.path.join(self.output_dir, memory_snapshot_name(self.host, self.rank, iteration, reason))
        started = time.perf_counter()
        try:
            snapshot_fn = self._snapshot_fn
            if snapshot_fn is None:
                import torch

                snapshot_fn = torch.cuda.memory._snapshot
            write_snapshot(snapshot_fn(), path)
        except Exception as err:  # noqa: BLE001  (a failed snapshot must not end the run)
            logger.error("could not write the memory snapshot %s: %s", path, err)
            return None
        self.written.append(path)
        logger.info("memory snapshot %s written in %.1f s (view it at https://pytorch.org/memory_viz)",
                    path, time.perf_counter() - started)
        return path

    def close(self) -> None:
        """Stop recording allocator history; safe to call twice."""
        if not self.recording:
            return
        self.recording = False
        record = self._record_fn
        if record is None:
            import torch

            record = torch.cuda.memory._record_memory_history
        try:
            record(enabled=None)
        except Exception as err:  # noqa: BLE001
            logger.warning("could not stop recording CUDA memory history: %s", err)

    @staticmethod
    def _is_oom(exc: BaseException) -> bool:
        torch = sys.modules.get("torch")
        oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
        return oom_type is not None and isinstance(exc, oom_type)

    @contextlib.contextmanager
    def session(self) -> Iterator[MemorySnapshotter]:
        """``start()`` ... ``close()`` as a context manager.

        Returns:
            The context manager, yielding the snapshotter.
        """
        self.start()
        try:
            yield self
        finally:
            self.close()

