"""TFLOP/s per GPU and model FLOPs utilisation (MFU) from the model FLOPs of one iteration.

``throughput`` is Megatron-LM's key (TFLOP/s per GPU: model FLOPs per iteration / seconds per
iteration / GPUs / 1e12); ``mfu`` is that over the GPU's dense peak, in percent.  The peak is
``--metrics-peak-tflops`` when given, else :mod:`torchprof_args.device_peaks`' figure for this
rank's device name and ``--metrics-peak-dtype``; an unknown device (or no GPU) omits MFU with one
warning naming the flag.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from torchprof_args import _dist
from torchprof_args.device_peaks import peak_tflops
from torchprof_args.log import get_logger

__all__ = ["FlopsSource", "PeakResolver", "flops_value", "rate_figures", "throughput_figures"]

logger = get_logger(__name__)

#: Model FLOPs of one iteration: a number, or a callable of the iteration (the Python API).
FlopsSource = float | Callable[[int], float] | None


def flops_value(source: FlopsSource, iteration: int) -> float | None:
    """The FLOPs of ``iteration`` from a number or a callable (None when it gives nothing usable)."""
    value = source(iteration) if callable(source) else source
    try:
        number = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return number if number and number > 0 else None


def rate_figures(step_time: float | None, *, samples: float | None, tokens: float | None) -> dict[str, float]:
    """``throughput/samples-per-sec`` and ``throughput/tokens-per-sec`` from per-iteration counts."""
    if not step_time or step_time <= 0:
        return {}
    figures: dict[str, float] = {}
    if samples:
        figures["throughput/samples-per-sec"] = samples / step_time
    if tokens:
        figures["throughput/tokens-per-sec"] = tokens / step_time
    return figures


def _device_name() -> str | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # noqa: BLE001 - a broken driver: unknown device
        return None
    return None


class PeakResolver:
    """The dense peak TFLOP/s per GPU, resolved once: ``override`` (``--metrics-peak-tflops``), else
    the table's figure for ``device_name()`` and ``dtype``; None (with one warning) when unknown."""

    def __init__(self, override: float | None = None, dtype: str = "bf16",
                 device_name: Callable[[], str | None] = _device_name) -> None:
        self.override = override
        self.dtype = dtype
        self._device_name = device_name
        self._resolved = False
        self._peak: float | None = None

    def peak(self) -> float | None:
        if not self._resolved:
            self._resolved = True
            self._peak = self.override or self._from_table()
        return self._peak

    def _from_table(self) -> float | None:
        name = self._device_name()
        peak = peak_tflops(name, self.dtype) if name else None
        if peak is None and _dist.rank() == 0:  # one line for the job, not one per rank
            device = f"device {name!r}" if name else "no GPU"
            logger.warning("MFU is not logged: no peak TFLOP/s known for %s (%s); pass --metrics-peak-tflops "
                           "with the dense peak per GPU to get it.", device, self.dtype)
        return peak


def throughput_figures(step_time: float | None, world_size: int, flops: float | None,
                       peak: PeakResolver | float | None = None) -> dict[str, float]:
    """``throughput`` (TFLOP/s per GPU) and, with a ``peak`` (a :class:`PeakResolver` or a number),
    ``mfu`` in percent; nothing without FLOPs or a step time."""
    if not flops or not step_time or step_time <= 0 or world_size <= 0:
        return {}
    tflops = flops / step_time / world_size / 1e12
    figures = {"throughput": tflops}
    value = peak.peak() if isinstance(peak, PeakResolver) else peak
    if value:
        figures["mfu"] = 100.0 * tflops / value
    return figures
