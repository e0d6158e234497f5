"""The peak table: the names torch and Kineto report map to the right entry."""

import pytest

from torchprof_args.device_peaks import find_device, peak_tbps, peak_tflops


@pytest.mark.parametrize("name, label, bf16", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200", 989.4),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA GH200 480GB", "GH200", 989.4),
    ("NVIDIA B200", "B200", 2250.0),
    ("NVIDIA GB200", "GB200", 2500.0),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100", 312.0),
    ("NVIDIA L40S", "L40S", 362.05),
    ("AMD Instinct MI250X / MI250", "MI250X", 383.0),
    ("AMD Instinct MI250", "MI250", 362.1),
    ("AMD Instinct MI300X", "MI300X", 1307.4),
    ("AMD Instinct MI325X", "MI325X", 1307.4),
])
def test_known_devices(name, label, bf16):
    entry = find_device(name)
    assert entry is not None and entry.label == label
    assert peak_tflops(name) == bf16 == peak_tflops(name, "fp16")


def test_fp8_and_unknowns():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 1978.9
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert peak_tflops("NVIDIA GeForce RTX 3090") is None
    with pytest.raises(ValueError, match="unknown data type"):
        peak_tflops("NVIDIA H200", "int4")


@pytest.mark.parametrize("name, tbps", [
    ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H200", 4.8), ("NVIDIA A100-SXM4-80GB", 2.039),
    ("NVIDIA A100-PCIE-40GB", 1.555), ("AMD Instinct MI300X", 5.3),
])
def test_memory_bandwidth(name, tbps):
    """The roofline's other roof: the datasheets' peak memory bandwidth (TB/s); the 40 GB A100's
    HBM2 is slower than the 80 GB one's HBM2e."""
    assert peak_tbps(name) == tbps
    assert peak_tbps("NVIDIA GeForce RTX 3090") is None
