"""A real Accelerate loop on 2 gloo ranks (the docs' example): optimizer steps at
``accelerator.sync_gradients`` with gradient accumulation 2; Accelerate's own profiler refused."""

from __future__ import annotations

import pytest
from helpers.examples import run_doc_example
from helpers.trace_events import count_per_step, load_trace

from torchprof_args.shared.metrics_log import read_records

pytest.importorskip("accelerate", reason="Accelerate (the huggingface extra) is not installed")
pytestmark = pytest.mark.slow


def test_docs_example_steps_on_sync_gradients(tmp_path):
    proc = run_doc_example("accelerate", tmp_path, WANDB_MODE="disabled")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "done: 6 optimizer steps of 2 micro-batches (12 micro-batches per rank)" in proc.stdout
    traces = sorted((tmp_path / "prof").glob("iter000003-000004/*.pt.trace.json.gz"))
    assert [p.name[:9] for p in traces] == ["rank00000", "rank00001"]
    for trace in traces:
        data = load_trace(trace)
        events = data["traceEvents"]  # two micro-batches, one optimizer step in each optimizer step
        assert count_per_step(events, lambda name: name == "aten::cross_entropy_loss") == {3: 2, 4: 2}
        assert count_per_step(events, lambda name: name.startswith("Optimizer.step#")) == {3: 1, 4: 1}
        assert data["torchprof_args"]["trainer"]["gradient_accumulation_steps"] == 2
        assert data["torchprof_args"]["trainer"]["distributed_type"] == "MULTI_CPU"
    records = read_records(tmp_path / "metrics" / "metrics.jsonl")  # the run's markers left out
    assert [r.iteration for r in records] == [2, 4, 6]
    assert records[1].metrics["timers/forward-backward-time"] > 0


def test_accelerate_s_own_profiler_is_refused(tmp_path):
    import argparse

    from accelerate import Accelerator
    from accelerate.utils import ProfileKwargs

    from torchprof_args import TorchProfileArgsError, add_torch_profile_args
    from torchprof_args.accelerate import profiler

    args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(
        ["--torch-profile", "--torch-profile-dir", str(tmp_path)])
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(activities=["cpu"])])
    with pytest.raises(TorchProfileArgsError, match="Accelerate's profiler"):
        profiler(accelerator, args)
