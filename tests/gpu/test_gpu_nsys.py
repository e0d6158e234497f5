"""``--torch-profile-nsys`` on a GPU: cudaProfilerStart/Stop around exactly the scheduled active
steps, NVTX ranges for steps and timers.

What is checked, and how:

* the calls themselves: ``torch.cuda.nvtx.range_push/range_pop`` and ``torch.cuda.cudart()``'s
  ``cudaProfilerStart/Stop`` are wrapped by spies that record each call and then make the real
  one (NVTX and the CUDA profiler API run for real; without a tool attached they do nothing);
* the trace: with ``--torch-profile`` on too, CUPTI records the ``cudaProfilerStart`` runtime call,
  which must lie inside ``ProfilerStep#<first active step>``.  (Kineto records no NVTX ranges, and
  the stop falls after the window's flush, outside the trace.)  Skipped, saying so, if this
  Kineto build records no cudaProfiler* call at all;
* end to end, where Nsight Systems' ``nsys`` is on PATH: ``torchprof nsys --run`` captures a job
  and ``nsys stats`` lists the NVTX step ranges of the active steps only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.cuda import requires_gpus
from helpers.gpu_train import Trainer, parse_flags
from helpers.paths import REPO
from helpers.processes import subprocess_env

from torchprof_args import TorchProfiler
from torchprof_args.analysis import load_trace
from torchprof_args.capture.metrics.timers import Timers

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_gpus(1), pytest.mark.timeout(300)]

#: --torch-profile-skip-first 2, warmup 1, active 2: iterations 4 and 5 are recorded.
SCHEDULE = ("--torch-profile-skip-first", "2", "--torch-profile-active", "2")
ACTIVE = (4, 5)
ITERATIONS = range(1, 9)


class CudartSpy:
    """``torch.cuda.cudart()`` that notes cudaProfilerStart/Stop, then calls the real ones."""

    def __init__(self, real: Any, calls: list[str]) -> None:
        self._real, self._calls = real, calls
        self.results: list[Any] = []

    def cudaProfilerStart(self) -> Any:  # noqa: N802  (CUDA's name)
        self._calls.append("start")
        self.results.append(self._real.cudaProfilerStart())
        return self.results[-1]

    def cudaProfilerStop(self) -> Any:  # noqa: N802
        self._calls.append("stop")
        self.results.append(self._real.cudaProfilerStop())
        return self.results[-1]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture(scope="module")
def spied_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    """8 iterations with --torch-profile --torch-profile-nsys and a timer per step; returns the
    spied calls in order and the published trace."""
    calls: list[str] = []
    real_push, real_pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

    def push(message: str) -> Any:
        calls.append(f"push {message}")
        return real_push(message)

    def pop() -> Any:
        calls.append("pop")
        return real_pop()

    cudart = CudartSpy(torch.cuda.cudart(), calls)
    out = tmp_path_factory.mktemp("nsys")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda.nvtx, "range_push", push)
        patch.setattr(torch.cuda.nvtx, "range_pop", pop)
        patch.setattr(torch.cuda, "cudart", lambda: cudart)
        args = parse_flags(
            "--torch-profile", "--torch-profile-nsys", "--torch-profile-dir", str(out), *SCHEDULE
        )
        prof = TorchProfiler.from_args(args)
        timer = Timers.from_args(args)("forward-backward", log_level=0)
        trainer = Trainer()
        with prof:
            for iteration in ITERATIONS:
                timer.start()
                trainer.step()
                timer.stop()
                prof.step(iteration)
    (trace,) = prof.published_traces
    return calls, trace


def test_capture_covers_exactly_the_active_steps(spied_run) -> None:
    calls, _ = spied_run
    assert calls.count("start") == 1 and calls.count("stop") == 1, calls
    start, stop = calls.index("start"), calls.index("stop")
    assert start < stop
    inside = [c for c in calls[start:stop] if c.startswith("push step ")]
    assert inside == [f"push step {i}" for i in ACTIVE], calls


def test_nvtx_ranges_for_every_step_and_timer(spied_run) -> None:
    """One ``step N`` range per iteration (N = 1..9: the one after the last step() is open until
    stop()), each timer range nested inside a step range, every push popped."""
    calls, _ = spied_run
    steps = [int(c.split()[-1]) for c in calls if c.startswith("push step ")]
    assert steps == [*ITERATIONS, ITERATIONS[-1] + 1], calls
    depth, timers = 0, 0
    for call in calls:
        if call.startswith("push "):
            depth += 1
            if call == "push forward-backward":
                timers += 1
                assert depth == 2, f"the timer range is not inside a step range: {calls}"
        elif call == "pop":
            depth -= 1
            assert depth >= 0, calls
    assert depth == 0 and timers == len(ITERATIONS), calls


def test_trace_shows_cuda_profiler_start_in_the_first_active_step(spied_run) -> None:
    _, trace_path = spied_run
    trace = load_trace(trace_path)
    spans: dict[str, list[tuple[float, float]]] = {}
    for index, name_id in enumerate(trace.name_id):
        name = trace.names[name_id]
        on_gpu = trace.cats[trace.cat_id[index]] == "gpu_user_annotation"  # Kineto's GPU copy of a step
        if name.startswith(("cudaProfilerSt", "ProfilerStep#")) and not on_gpu:
            start = float(trace.ts[index])
            spans.setdefault(name, []).append((start, start + float(trace.dur[index])))
    if not any(name.startswith("cudaProfilerSt") for name in spans):
        pytest.skip(
            "this Kineto build records no cudaProfilerStart/Stop runtime call; the calls are checked by "
            "the spies above"
        )
    assert "cudaProfilerStop" not in spans, "the capture stops only after the window's flush"
    (call,) = spans["cudaProfilerStart"]
    (step,) = spans[f"ProfilerStep#{ACTIVE[0]}"]
    assert step[0] <= call[0] <= step[1], (call, step)


@pytest.mark.skipif(shutil.which("nsys") is None, reason="Nsight Systems' nsys is not on PATH")
def test_nsys_captures_only_the_active_steps(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        from helpers.gpu_train import Trainer, parse_flags, train
        from torchprof_args import TorchProfiler

        prof = TorchProfiler.from_args(parse_flags("--torch-profile-nsys", *{SCHEDULE!r}))
        train(prof, Trainer(), range({ITERATIONS.start}, {ITERATIONS.stop}))
    """)
    )
    out = tmp_path / "nsys"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchprof_args",
            "nsys",
            "--run",
            "--output-dir",
            str(out),
            "--",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=subprocess_env(),
        cwd=REPO,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    (report,) = out.glob("*.nsys-rep")
    output = ""
    for name in ("nvtx_sum", "nvtxsum"):  # renamed in Nsight Systems 2023
        stats = subprocess.run(
            ["nsys", "stats", "--force-export=true", "--report", name, "--format", "csv", str(report)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        output = stats.stdout + stats.stderr
        if stats.returncode == 0 and "step" in stats.stdout:
            break
    steps = sorted({int(n) for n in re.findall(r"\bstep (\d+)\b", output)})
    assert steps == list(ACTIVE), output[-3000:]
