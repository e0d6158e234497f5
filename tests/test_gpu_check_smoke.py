"""``benchmarks/gpu_check.py`` cannot rot on CPU-only machines: its ``--smoke`` mode runs every
section at toy sizes and writes the table and the JSON; without ``--smoke`` it says in one line
that there is no CUDA and exits 0."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cuda import cpu_only
from helpers.paths import REPO
from helpers.processes import subprocess_env

SCRIPT = REPO / "benchmarks" / "gpu_check.py"

pytestmark = [pytest.mark.slow, cpu_only]


def test_smoke_run_fills_every_section(tmp_path: Path) -> None:
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
        cwd=tmp_path,
    )
    seconds = time.monotonic() - started
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert seconds < 60, f"the smoke run took {seconds:.0f} s"
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["smoke"] is True
    rows = results["rows"]
    sections = {"tests", "analysis", "stall", "fork", "timers", "snapshot", "memory", "trace-size"}
    assert {r["section"] for r in rows} == sections
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    gpu_tests = [r for r in rows if r["check"].startswith("test_gpu_")]
    assert len(gpu_tests) >= 10 and all(
        r["result"].startswith("skipped") and "CUDA" in r["notes"] or "nsys" in r["notes"] for r in gpu_tests
    ), gpu_tests
    stalls = {
        r["check"]: r["value"]
        for r in rows
        if r["section"] == "stall" and r["setting"].startswith("3 active")
    }
    assert set(stalls) == {"flush stall, stock", "flush stall, floor", "flush stall, torchprof"}
    assert all(isinstance(v, float) for v in stalls.values())
    sizes = [r for r in rows if r["section"] == "trace-size"]
    assert [r["setting"] for r in sizes] == [
        "none",
        "record_shapes",
        "with_stack",
        "profile_memory",
        "with_flops",
        "with_modules",
    ]
    assert all(r["value"] > 0 for r in sizes)
    table = (tmp_path / "results.md").read_text().splitlines()
    header = table.index("| section | check | setting | result | notes |")
    body = table[header + 2 :]
    assert table[header + 1] == "|---|---|---|---|---|" and len(body) == len(rows)
    assert all(line.count(" | ") == 4 for line in body)
    assert "| section | check |" in run.stdout  # the same table is printed


def test_without_cuda_one_line_and_exit_0(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    assert run.returncode == 0
    assert run.stdout.count("\n") == 1 and "CUDA is not available" in run.stdout, run.stdout
    assert not (tmp_path / "out").exists()
