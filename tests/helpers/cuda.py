"""Where CUDA is and is not: skip markers for the GPU tests and for the CPU-fallback tests.

The suite runs on CPU-only machines and on GPU hosts alike, so no test asserts that CUDA is absent:
a test of the CPU fallback skips (with the reason) where CUDA is present, and a GPU test skips
(with the reason) where it is not, or where there are fewer GPUs than it needs.
"""

from __future__ import annotations

import pytest
import torch


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without CUDA or with a broken driver)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver is "no GPU" for choosing tests
        return 0


#: On a test of the CPU fallback: it cannot happen where CUDA is present (tests/gpu covers that path).
cpu_only = pytest.mark.skipif(
    cuda_device_count() > 0,
    reason="checks the CPU-only fallback; CUDA is available here (tests/gpu covers it)",
)


def requires_gpus(count: int = 1) -> pytest.MarkDecorator:
    """Skip unless at least ``count`` CUDA devices are visible (the reason says how many are)."""
    found = cuda_device_count()
    what = "CUDA is not available" if found == 0 else f"only {found} CUDA device(s) visible"
    return pytest.mark.skipif(
        found < count,
        reason=f"needs {count} CUDA device(s): {what} (torch "
        f"{torch.__version__}, built for CUDA {torch.version.cuda})",
    )
