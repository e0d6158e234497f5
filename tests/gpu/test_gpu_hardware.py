"""The real allocator and NVML paths of the step-timer readings (issue 19) on a GPU: no stand-ins.

Skips with the reason without CUDA; the NVML test also without nvidia-ml-py (the ``[gpu]`` extra).
"""

from __future__ import annotations

import pytest
import torch
from helpers.cuda import requires_gpus

from torchprof_args.capture.metrics.hardware import DeviceReadings
from torchprof_args.capture.metrics.mfu import PeakResolver
from torchprof_args.device_peaks import peak_tflops

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1), pytest.mark.timeout(120)]


def test_allocator_readings_from_the_real_memory_stats() -> None:
    torch.cuda.init()
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    figures = DeviceReadings(hardware=False).read()
    del block
    assert figures["memory/max-allocated-gb"] >= 0.25
    assert figures["memory/max-reserved-gb"] >= figures["memory/max-allocated-gb"]
    assert figures["memory/fragmentation-gb"] >= 0.0
    assert figures["memory/alloc-retries"] >= 0 and figures["memory/ooms"] >= 0


def test_nvml_readings_of_this_gpu() -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install 'torchprof-args[gpu]')")
    torch.cuda.init()
    torch.ones(1, device="cuda")
    figures = DeviceReadings().read()
    assert 100 <= figures["gpu/sm-clock-mhz"] <= 4000
    assert 1 <= figures["gpu/power-w"] <= 2000
    assert 5 <= figures["gpu/temperature-c"] <= 120
    assert figures["gpu/throttle-reasons"] >= 0


def test_the_peak_table_knows_this_gpu() -> None:
    name = torch.cuda.get_device_name()
    peak = PeakResolver(None, "bf16").peak()
    assert peak == peak_tflops(name, "bf16"), name
    if any(model in name for model in ("H100", "H200", "A100", "B200")):
        assert peak is not None and peak > 100
