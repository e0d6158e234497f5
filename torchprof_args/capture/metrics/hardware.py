"""This rank's CUDA allocator health and GPU hardware readings, once per log interval.

Both ride as per-rank figures in the timers' one fixed-size all-gather
(:mod:`~torchprof_args.capture.metrics.gather`), so every rank sees every rank's readings without another
collective:

* allocator (``torch.cuda.memory_stats``, a host-side read, no device sync):
  ``memory/max-allocated-gb``, ``memory/max-reserved-gb`` (peaks since start),
  ``memory/fragmentation-gb`` (peak reserved minus peak allocated: cached blocks the allocator
  could not hand out), ``memory/alloc-retries`` (``num_alloc_retries``: cudaMalloc failed, the
  cache was freed and the allocation retried; each one stalls the step) and ``memory/ooms``;
* GPU hardware through NVML (``nvidia-ml-py``, the ``[gpu]`` extra, imported lazily; without it one
  info line and no ``gpu/`` figures): ``gpu/sm-clock-mhz``, ``gpu/power-w``, ``gpu/temperature-c``,
  ``gpu/throttle-reasons`` (NVML's bit mask, decoded by :func:`throttle_text`),
  ``gpu/ecc-uncorrected`` (volatile uncorrected ECC errors) and ``gpu/xid-errors`` (critical XID
  events seen since start).

A reading that fails (a field the GPU does not support, a driver hiccup) is left out; metrics
never stop training.  :func:`hardware_reason` turns one rank's readings against the median into
the straggler warning's "why".
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchprof_args import _dist
from torchprof_args.log import get_logger

__all__ = ["DeviceReadings", "hardware_reason", "throttle_text"]

logger = get_logger(__name__)

GIB = float(2**30)

#: NVML's clock-event (throttle) reason bits that slow a busy GPU down, in the order they are named.
THROTTLE_REASONS = (
    (0x40, "thermal slowdown (hardware)"),
    (0x20, "thermal slowdown"),
    (0x08, "hardware slowdown"),
    (0x80, "power brake"),
    (0x04, "power cap"),
    (0x10, "sync boost"),
)
#: A rank's SM clock under this fraction of the median is named as the straggler's reason.
SLOW_CLOCK_RATIO = 0.95


def throttle_text(mask: float | None) -> str:
    """NVML's throttle-reason bit mask as words ("thermal slowdown, power cap"); "" for none."""
    if mask is None or not math.isfinite(mask):
        return ""
    bits = int(mask)
    return ", ".join(text for bit, text in THROTTLE_REASONS if bits & bit)


def hardware_reason(per_rank: Sequence[Mapping[str, float] | None], rank: int) -> str:
    """Why group rank ``rank`` may be slow, from every rank's ``gpu/`` readings; "" when nothing
    stands out.  E.g. "SM clock 1410 MHz vs median 1980 MHz, thermal slowdown"."""
    mine: Mapping[str, float] = (per_rank[rank] if rank < len(per_rank) else None) or {}
    parts: list[str] = []
    clock = mine.get("gpu/sm-clock-mhz")
    clocks = [f["gpu/sm-clock-mhz"] for f in per_rank if f and "gpu/sm-clock-mhz" in f]
    if clock is not None and len(clocks) >= 2:
        median = statistics.median(clocks)
        if median > 0 and clock < SLOW_CLOCK_RATIO * median:
            parts.append(f"SM clock {clock:.0f} MHz vs median {median:.0f} MHz")
    throttled = throttle_text(mine.get("gpu/throttle-reasons"))
    if throttled:
        parts.append(throttled)
    for key, label in (("gpu/xid-errors", "XID errors"), ("gpu/ecc-uncorrected", "uncorrected ECC errors")):
        if mine.get(key):
            parts.append(f"{mine[key]:.0f} {label}")
    return ", ".join(parts)


def _default_memory_stats() -> Callable[[], Mapping[str, Any]] | None:
    """``torch.cuda.memory_stats`` once CUDA is up in this process (never initialises it)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.memory_stats
    except Exception:  # noqa: BLE001 - a broken driver means no readings
        return None
    return None


def allocator_figures(stats: Mapping[str, Any]) -> dict[str, float]:
    """The allocator figures from one ``torch.cuda.memory_stats()`` dict."""
    figures: dict[str, float] = {}
    allocated, reserved = stats.get("allocated_bytes.all.peak"), stats.get("reserved_bytes.all.peak")
    if allocated is not None:
        figures["memory/max-allocated-gb"] = allocated / GIB
    if reserved is not None:
        figures["memory/max-reserved-gb"] = reserved / GIB
    if allocated is not None and reserved is not None:
        figures["memory/fragmentation-gb"] = max(0, reserved - allocated) / GIB
    for source, key in (("num_alloc_retries", "memory/alloc-retries"), ("num_ooms", "memory/ooms")):
        if source in stats:
            figures[key] = float(stats[source])
    return figures


def _nvml_index() -> int:
    """NVML's index of this process's GPU: the current CUDA device through CUDA_VISIBLE_DEVICES."""
    index = 0
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        except Exception:  # noqa: BLE001
            index = 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index


def _clock_event_reasons(nvml: Any) -> Callable[[Any], float]:
    """NVML's clock-event reasons call: its newer name (nvidia-ml-py 12.535+), else the older one."""
    return (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)


class DeviceReadings:
    """Reads this rank's allocator and NVML figures (see the module docstring).

    ``memory_stats`` (a callable returning ``torch.cuda.memory_stats()``'s dict) and ``nvml`` (the
    ``pynvml`` module) default to the real ones; ``hardware=False`` turns NVML off
    (``--metrics-gpu-hardware off``).  NVML is only asked for when CUDA is up, or when ``nvml``
    is given.
    """

    def __init__(self, *, hardware: bool = True, memory_stats: Callable[[], Mapping[str, Any]] | None = None,
                 nvml: Any = None) -> None:
        self._memory_stats = memory_stats
        self._hardware = hardware
        self._nvml = nvml
        self._nvml_given = nvml is not None
        self._handle: Any = None
        self._events: Any = None
        self._xid_count = 0
        self._nvml_failed = False

    def read(self) -> dict[str, float]:
        """This interval's figures (empty without CUDA and NVML)."""
        figures: dict[str, float] = {}
        stats_fn = self._memory_stats or _default_memory_stats()
        if stats_fn is not None:
            try:
                figures.update(allocator_figures(stats_fn()))
            except Exception as err:  # noqa: BLE001 - metrics never stop training
                logger.debug("torch.cuda.memory_stats failed: %s", err)
        if self._hardware and (self._nvml_given or _default_memory_stats() is not None):
            figures.update(self._nvml_figures())
        return figures

    def _device(self) -> Any:
        """The NVML handle of this rank's GPU, set up once (None when NVML is unavailable)."""
        if self._handle is not None or self._nvml_failed:
            return self._handle
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(_nvml_index())
        except ImportError:
            self._nvml_failed = True
            if _dist.rank() == 0:  # one line for the job, not one per rank
                logger.info("GPU hardware readings (clock, power, temperature, throttling, ECC/XID) are off: "
                            "install nvidia-ml-py (pip install nvidia-ml-py; the torchprof-args[gpu] extra) "
                            "to get them.")
            return None
        except Exception as err:  # noqa: BLE001
            self._nvml_failed = True
            logger.info("GPU hardware readings are off: NVML could not start (%s: %s).",
                        type(err).__name__, err)
            return None
        self._events = self._xid_events()
        return self._handle

    def _xid_events(self) -> Any:
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self._handle, nvml.nvmlEventTypeXidCriticalError, events)
            return events
        except Exception:  # noqa: BLE001 - not supported (e.g. MIG, some drivers): no XID count
            return None

    def _nvml_figures(self) -> dict[str, float]:
        handle = self._device()
        if handle is None:
            return {}
        nvml = self._nvml
        readers: tuple[tuple[str, Callable[[], float]], ...] = (
            ("gpu/sm-clock-mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            ("gpu/power-w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            ("gpu/temperature-c", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            ("gpu/throttle-reasons", lambda: _clock_event_reasons(nvml)(handle)),
            ("gpu/ecc-uncorrected", lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)),
        )
        figures: dict[str, float] = {}
        for key, read in readers:
            try:
                figures[key] = float(read())
            except Exception:  # noqa: BLE001 - a field this GPU or driver does not support
                continue
        if self._events is not None:
            figures["gpu/xid-errors"] = float(self._count_xids())
        return figures

    def _count_xids(self) -> int:
        """Drain the XID events that arrived since the last interval (no waiting)."""
        nvml = self._nvml
        for _ in range(64):
            try:
                nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: no more events
                break
            self._xid_count += 1
        return self._xid_count
