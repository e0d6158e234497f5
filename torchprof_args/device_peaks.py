"""Published dense peak TFLOP/s and memory bandwidth of training GPUs, by device name and data type.

One table for everything that needs a peak: the step timers' MFU (``metrics/``) and
``torchprof diagnose``'s ``low_mfu`` finding (``analysis/``).  Figures are the vendors' datasheet
numbers *without* structured sparsity (sparse figures are twice these), per GPU.  A device name is
what ``torch.cuda.get_device_name()`` returns, which is also the ``name`` of a Kineto trace's
``deviceProperties`` ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "AMD Instinct MI300X").
No torch import: the analysis tools use it on machines without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPES", "PEAKS", "DevicePeak", "find_device", "peak_tbps", "peak_tflops"]

#: the data types the table knows; "bf16" is the default (fp16 is the same figure everywhere here).
DTYPES = ("bf16", "fp16", "fp8", "tf32")


@dataclass(frozen=True)
class DevicePeak:
    """One device's dense peaks in TFLOP/s (None: not published / not supported) and its memory's
    peak bandwidth in TB/s (the roofline's other roof: ``summary``'s compiled kernels)."""

    label: str
    #: lower-case substrings that must all appear in the device name.
    match: tuple[str, ...]
    bf16: float
    fp8: float | None = None
    tf32: float | None = None
    tbps: float | None = None

    def tflops(self, dtype: str = "bf16") -> float | None:
        """The peak for ``dtype`` (one of :data:`DTYPES`), None when the vendor publishes none."""
        if dtype not in DTYPES:
            raise ValueError(f"unknown data type {dtype!r}: use one of {', '.join(DTYPES)}")
        if dtype in ("bf16", "fp16"):
            return self.bf16
        return self.fp8 if dtype == "fp8" else self.tf32


#: most specific first: the first entry whose substrings all appear in the name wins.
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("GB200", ("gb200",), 2500.0, fp8=5000.0, tf32=1250.0, tbps=8.0),
    DevicePeak("B200", ("b200",), 2250.0, fp8=4500.0, tf32=1100.0, tbps=8.0),
    DevicePeak("GH200", ("gh200",), 989.4, fp8=1978.9, tf32=494.7, tbps=4.0),
    DevicePeak("H200 NVL", ("h200", "nvl"), 835.5, fp8=1670.5, tf32=417.5, tbps=4.8),
    DevicePeak("H200", ("h200",), 989.4, fp8=1978.9, tf32=494.7, tbps=4.8),
    DevicePeak("H100 NVL", ("h100", "nvl"), 835.5, fp8=1670.5, tf32=417.5, tbps=3.9),
    DevicePeak("H100 PCIe", ("h100", "pcie"), 756.5, fp8=1513.0, tf32=378.0, tbps=2.0),
    DevicePeak("H100 SXM", ("h100",), 989.4, fp8=1978.9, tf32=494.7, tbps=3.35),
    DevicePeak("A100", ("a100", "40gb"), 312.0, tf32=156.0, tbps=1.555),
    DevicePeak("A100", ("a100",), 312.0, tf32=156.0, tbps=2.039),
    DevicePeak("L40S", ("l40s",), 362.05, fp8=733.0, tf32=183.0, tbps=0.864),
    DevicePeak("MI325X", ("mi325x",), 1307.4, fp8=2614.9, tf32=653.7, tbps=6.0),
    DevicePeak("MI300X", ("mi300x",), 1307.4, fp8=2614.9, tf32=653.7, tbps=5.3),
    DevicePeak("MI250X", ("mi250x",), 383.0, tbps=3.2768),
    DevicePeak("MI250", ("mi250",), 362.1, tbps=3.2768),
)


def find_device(device_name: str) -> DevicePeak | None:
    """The table's entry for ``device_name`` (case-insensitive substring match), None if unknown."""
    name = device_name.lower()
    for entry in PEAKS:
        if all(part in name for part in entry.match):
            return entry
    return None


def peak_tflops(device_name: str, dtype: str = "bf16") -> float | None:
    """Dense peak TFLOP/s of ``device_name`` for ``dtype``; None for an unknown device or dtype
    the vendor publishes no figure for.  Callers offer a flag to override (an unknown device)."""
    entry = find_device(device_name)
    return entry.tflops(dtype) if entry else None


def peak_tbps(device_name: str) -> float | None:
    """Peak memory bandwidth of ``device_name`` in TB/s; None for an unknown device."""
    entry = find_device(device_name)
    return entry.tbps if entry else None
