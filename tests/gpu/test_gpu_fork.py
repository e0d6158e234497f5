"""The cost of the forked export that grows with pinned host memory, on a GPU: with
``PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True`` torch pins ``pin_memory=True`` tensors
in place with cudaHostRegister, whose pages ``fork()`` copies (seconds per 8 GB on an H200 node:
docs/gpu-validation.md).  A job holding such a buffer gets the one warning that names the cause,
and its trace is still published; with torch's default pinning (cudaHostAlloc) it gets none."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.cuda import requires_gpus
from helpers.processes import subprocess_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1), pytest.mark.timeout(300)]

JOB = textwrap.dedent("""
    import argparse, sys
    import torch
    from torchprof_args import TorchProfiler, add_torch_profile_args

    buffer = torch.ones(8 << 30, dtype=torch.uint8).pin_memory()  # an 8 GB pinned host buffer
    model = torch.nn.Linear(1024, 1024).cuda()
    flags = ["--torch-profile", "--torch-profile-dir", sys.argv[1], "--torch-profile-skip-first", "0",
             "--torch-profile-warmup", "1", "--torch-profile-active", "1", "--torch-profile-export", "fork"]
    prof = TorchProfiler.from_args(add_torch_profile_args(argparse.ArgumentParser()).parse_args(flags))
    with prof:
        for step in range(1, 6):
            model(torch.randn(64, 1024, device="cuda")).sum().backward()
            prof.step(step)
    print("published", len(prof.published_traces))
""")
WARNING = "fork() for the trace export held the training thread"


@pytest.mark.parametrize("register", [True, False], ids=["cudaHostRegister", "cudaHostAlloc"])
def test_a_fork_slowed_by_registered_pinned_memory_is_reported(tmp_path: Path, register: bool) -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True"} if register else {}
    run = subprocess.run(
        [sys.executable, "-c", JOB, str(tmp_path / "prof")],
        capture_output=True,
        text=True,
        timeout=240,
        env=subprocess_env(**env),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "published 1" in run.stdout, run.stdout + run.stderr[-3000:]
    warnings = [line for line in run.stderr.splitlines() if WARNING in line]
    if register:
        assert len(warnings) == 1 and "cudaHostRegister" in warnings[0], run.stderr[-3000:]
    else:
        assert warnings == [], warnings
