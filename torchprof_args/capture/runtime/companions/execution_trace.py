"""PyTorch's execution trace (Chakra input) over the same windows as the Kineto trace.

With ``--torch-profile-execution-trace`` the :class:`~torchprof_args.capture.runtime.recorder.Recorder`
opens one :class:`ExecutionTrace` file per recorded window on the traced ranks: PyTorch's
``ExecutionTraceObserver`` is registered on a file in node-local staging and enabled just before
torch.profiler starts recording (so the first step's ``ProfilerStep#`` range is in it), disabled
and finalised when the window is flushed.  The finished file then travels with the Kineto trace:
the publisher compresses it into the cycle folder's ``execution_traces/`` (not beside the traces:
HTA reads every .json/.gz there as a trace), through the same hidden ``.partial-`` name and
rename, as ``<stem>.et.json.gz`` (:func:`~torchprof_args.naming.companion_path`).

PyTorch allows one observer per process at a time; windows never overlap, so that holds.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from torchprof_args.log import get_logger

if TYPE_CHECKING:
    from torch.profiler import ExecutionTraceObserver

__all__ = ["ExecutionTrace"]

logger = get_logger(__name__)


class ExecutionTrace:
    """One execution-trace file per window, written to ``staging_dir``.

    Errors never escape: a failure is logged with the rank, that window has no execution trace,
    and training goes on.
    """

    def __init__(self, staging_dir: str | os.PathLike[str], *, rank: int) -> None:
        self.staging_dir = Path(staging_dir)
        self.rank = rank
        self._observer: ExecutionTraceObserver | None = None
        self._path: Path | None = None

    @property
    def recording(self) -> bool:
        return self._observer is not None

    def start(self, first: int) -> None:
        """Begin the file of the window that starts recording at iteration ``first``."""
        if self._observer is not None:
            return
        try:
            from torch.profiler import ExecutionTraceObserver

            self._path = self.staging_dir / f"rank{self.rank:05d}_pid{os.getpid()}_iter{first:06d}.et.json"
            self._observer = ExecutionTraceObserver().register_callback(str(self._path))
            self._observer.start()
        except Exception as err:  # noqa: BLE001 - profiling must never stop training
            logger.error("rank %d: could not start the execution trace at iteration %d: %s: %s; the Kineto "
                         "trace goes on", self.rank, first, type(err).__name__, err)
            self.discard()

    def finish(self) -> Path | None:
        """Stop and finalise the window's file; returns it (None when nothing was recorded)."""
        observer, path = self._observer, self._path
        self._observer = self._path = None
        if observer is None or path is None:
            return None
        try:
            observer.stop()
            observer.unregister_callback()  # writes the end of the JSON document
        except Exception as err:  # noqa: BLE001
            logger.error("rank %d: could not finish the execution trace %s: %s: %s", self.rank, path.name,
                         type(err).__name__, err)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return path if path.exists() else None

    def discard(self) -> None:
        """Stop and delete the window's file (the window is dropped)."""
        path = self.finish()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
