"""Stand-ins for what cannot exist on a CPU machine: NVML (the ``pynvml`` module) and
``torch.cuda.memory_stats``.  Only these are replaced; everything around them is real."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class NvmlError(Exception):
    """What pynvml raises (NVMLError); the stand-in raises it for unsupported fields and timeouts."""


class StandInNvml:
    """The subset of ``pynvml`` that :class:`torchprof_args.capture.metrics.hardware.DeviceReadings` calls.

    ``readings`` maps ``clock``, ``power_mw``, ``temperature``, ``throttle``, ``ecc`` to values;
    a missing key raises like an unsupported field.  ``xids`` XID events are pending.
    """

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, **readings: float) -> None:
        self.readings = dict(readings)
        self.xids = 0
        self.initialised = 0
        self.index: int | None = None

    def _get(self, key: str) -> float:
        if key not in self.readings:
            raise NvmlError(f"Not Supported: {key}")
        return self.readings[key]

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.initialised += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802
        self.index = index
        return f"gpu{index}"

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> float:  # noqa: N802
        return self._get("clock")

    def nvmlDeviceGetPowerUsage(self, handle: str) -> float:  # noqa: N802
        return self._get("power_mw")

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> float:  # noqa: N802
        return self._get("temperature")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> float:  # noqa: N802
        return self._get("throttle")

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> float:  # noqa: N802
        return self._get("ecc")

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "events"

    def nvmlDeviceRegisterEvents(self, handle: str, kinds: int, events: str) -> None:  # noqa: N802
        pass

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> Any:  # noqa: N802
        if self.xids <= 0:
            raise NvmlError("Timeout")
        self.xids -= 1
        return {"eventType": self.nvmlEventTypeXidCriticalError}


def memory_stats(state: dict[str, float]) -> Callable[[], dict[str, float]]:
    """A stand-in ``torch.cuda.memory_stats`` reading ``state`` (keys as torch's: ``num_alloc_retries``,
    ``allocated_bytes.all.peak`` ...), which the test changes between intervals."""
    return lambda: dict(state)
