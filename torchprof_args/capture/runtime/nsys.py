"""Nsight Systems: capture exactly the scheduled steps, with NVTX ranges for steps and timers.

Two halves that fit together:

* In the training process, ``--torch-profile-nsys`` makes :class:`NsysController` call
  ``cudaProfilerStart()`` when the schedule's recorded (active) steps begin and
  ``cudaProfilerStop()`` when they end, and wrap each step (and each step timer) in an NVTX range.
* Around the launcher, ``torchprof nsys -- CMD...`` (:mod:`torchprof_args.commands.nsys`)
  prints or runs the matching ``nsys profile --capture-range=cudaProfilerApi ...`` command, so the
  report holds those steps only instead of hours of start-up and training.

Import-light: torch is imported only when a controller is created.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from torchprof_args import _dist
from torchprof_args.log import get_logger

__all__ = ["CudaNsysBackend", "NsysController"]

logger = get_logger(__name__)


class NsysBackend(Protocol):
    """What the controller needs from CUDA; :class:`CudaNsysBackend` is the real one."""

    def synchronize(self) -> None: ...
    def profiler_start(self) -> None: ...
    def profiler_stop(self) -> None: ...
    def range_push(self, name: str) -> None: ...
    def range_pop(self) -> None: ...


class CudaNsysBackend:
    """``torch.cuda``'s profiler API and NVTX."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._cudart = torch.cuda.cudart()

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def profiler_start(self) -> None:
        self._cudart.cudaProfilerStart()

    def profiler_stop(self) -> None:
        self._cudart.cudaProfilerStop()

    def range_push(self, name: str) -> None:
        self._torch.cuda.nvtx.range_push(name)

    def range_pop(self) -> None:
        self._torch.cuda.nvtx.range_pop()


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001  (a broken CUDA install is "no CUDA" here)
        return False


class NsysController:
    """Starts/stops Nsight Systems capture around the recorded steps; NVTX ranges for steps.

    Hooks, called by the profiler on every rank:

    * ``on_step(iteration, recording)`` at the *start* of each iteration; ``recording`` is
      whether this iteration is one of the schedule's recorded (active) steps.  Capture starts
      (``cudaProfilerStart``) on the first recorded iteration and stops on the first one that is
      not, after a ``cuda.synchronize()`` so the captured kernels are exactly those steps'.  Each
      iteration runs inside an NVTX range ``step <iteration>``.
    * ``range(name)``: an NVTX range context manager (timers, phases).
    * ``close()``: ends the open step range and stops a running capture.

    Without CUDA every hook is a no-op, after one warning.  With ``enabled=False`` (flag not
    given) every hook is a silent no-op.
    """

    def __init__(self, enabled: bool = True, backend: NsysBackend | None = None,
                 cuda_available: bool | None = None) -> None:
        self.enabled = enabled
        self.capturing = False
        self._step_range_open = False
        self._backend: NsysBackend | None = None
        if not enabled:
            return
        available = _cuda_available() if cuda_available is None else cuda_available
        if not available:
            logger.warning(
                "--torch-profile-nsys needs CUDA, which is not available on rank %d: no Nsight "
                "Systems capture range or NVTX ranges will be emitted.", _dist.rank())
            self.enabled = False
            return
        self._backend = backend if backend is not None else CudaNsysBackend()

    def on_step(self, iteration: int, recording: bool) -> None:
        """Call at the start of ``iteration``; see the class docstring."""
        if not self.enabled:
            return
        backend = self._backend
        assert backend is not None
        self._end_step_range()
        if recording and not self.capturing:
            backend.synchronize()
            backend.profiler_start()
            self.capturing = True
            logger.info("nsys capture started at iteration %d", iteration)
        elif not recording and self._stop_capture():
            logger.info("nsys capture stopped before iteration %d", iteration)
        backend.range_push(f"step {iteration}")
        self._step_range_open = True

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        """An NVTX range around the block (no-op when disabled)."""
        if not self.enabled:
            yield
            return
        assert self._backend is not None
        self._backend.range_push(name)
        try:
            yield
        finally:
            self._backend.range_pop()

    def close(self) -> None:
        """End the open step range and a running capture; safe to call twice."""
        if not self.enabled:
            return
        self._end_step_range()
        if self._stop_capture():
            logger.info("nsys capture stopped at the end of the run")

    def _end_step_range(self) -> None:
        if self._step_range_open and self._backend is not None:
            self._backend.range_pop()
            self._step_range_open = False

    def _stop_capture(self) -> bool:
        """Stop a running capture after the device finished its work; True if one was running."""
        if not self.capturing or self._backend is None:
            return False
        self._backend.synchronize()
        self._backend.profiler_stop()
        self.capturing = False
        return True
