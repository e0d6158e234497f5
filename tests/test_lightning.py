"""Lightning DDP on 2 gloo ranks (the docs' example): optimizer steps with gradient accumulation 2,
the figures in the CSV logger; Lightning's own profiler refused before training, in one line."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from helpers.examples import run_doc_example
from helpers.paths import REPO
from helpers.processes import subprocess_env
from helpers.trace_events import count_per_step, load_trace

pytest.importorskip("lightning", reason="Lightning (the lightning extra) is not installed")
pytestmark = pytest.mark.slow


def test_docs_example_ddp_steps_and_loggers(tmp_path):
    proc = run_doc_example("lightning", tmp_path, WANDB_MODE="disabled")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "done at global step 6 (2 batches per step)" in proc.stdout
    traces = sorted((tmp_path / "prof").glob("iter000003-000004/*.pt.trace.json.gz"))
    assert [p.name[:9] for p in traces] == ["rank00000", "rank00001"]
    for trace in traces:
        data = load_trace(trace)
        losses = count_per_step(data["traceEvents"], lambda name: name == "aten::cross_entropy_loss")
        assert losses == {3: 2, 4: 2}
        assert data["torchprof_args"]["trainer"]["strategy"] == "DDPStrategy"
    with open(tmp_path / "logs" / "lightning_logs" / "version_0" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["step"] for row in rows] == ["2", "4", "6"]
    for row in rows:
        throughput = float(row["throughput"])
        assert throughput > 0 and float(row["mfu"]) == pytest.approx(100 * throughput)
        assert float(row["timers/forward-backward-time"]) > 0
    assert float(rows[1]["profiler/fence_waits"]) == 1


def test_lightning_s_own_profiler_is_refused_in_one_line(tmp_path):
    script = REPO / "integrations" / "lightning" / "train_lightning.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--lightning-profiler", "simple", "--torch-profile",
         "--torch-profile-dir", str(tmp_path / "prof"), "--log-dir", str(tmp_path)],
        cwd=tmp_path, env=subprocess_env(WANDB_MODE="disabled"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--torch-profile cannot run together with Lightning's Trainer(profiler=" \
        "SimpleProfiler)" in errors[0], proc.stderr[-3000:]
