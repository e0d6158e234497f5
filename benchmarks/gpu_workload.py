"""The GPU check's workload, shared by its sections (``gpu_check.py``, ``gpu_check_memory.py``,
``gpu_check_analysis.py``): the results row, the run's sizes, the demo GPT with AdamW, timed steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Row:
    """One line of the results table."""

    section: str
    check: str
    setting: str
    result: str
    notes: str = ""
    value: float | None = None
    ok: bool = True


@dataclasses.dataclass
class Settings:
    """Sizes for this run: the real ones on a GPU, toy ones for ``--smoke``."""

    device: str
    dtype: torch.dtype
    hidden: int
    layers: int
    heads: int
    seq_len: int
    batch: int
    vocab: int
    repeats: int
    fork_gb: list[float]
    timer_pairs: int
    snapshot_timeout: float
    tests_timeout: float

    @property
    def model(self) -> str:
        count = parameters(self)
        size = f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.2f}M"
        return (
            f"GPT {size} params, {self.layers}x{self.hidden}, seq {self.seq_len}, "
            f"batch {self.batch}, {str(self.dtype).removeprefix('torch.')}"
        )


def parameters(s: Settings) -> int:
    """Parameter count of the demo GPT with these sizes (embedding tied with the head)."""
    return (
        s.layers * (12 * s.hidden * s.hidden + 13 * s.hidden)
        + s.vocab * s.hidden
        + s.seq_len * s.hidden
        + 2 * s.hidden
    )


def settings(args: argparse.Namespace) -> Settings:
    if args.smoke:
        return Settings(
            "cpu",
            torch.float32,
            hidden=64,
            layers=2,
            heads=4,
            seq_len=64,
            batch=2,
            vocab=256,
            repeats=1,
            fork_gb=[0.05],
            timer_pairs=2000,
            snapshot_timeout=60,
            tests_timeout=120,
        )
    return Settings(
        "cuda",
        torch.bfloat16,
        args.hidden,
        args.layers,
        args.heads,
        args.seq_len,
        args.batch,
        args.vocab,
        args.repeats,
        args.fork_gb,
        args.timer_pairs,
        args.snapshot_timeout,
        args.tests_timeout,
    )


# -- the workload ------------------------------------------------------------------------------


def demo_model_module() -> Any:
    """integrations/demo/model.py (a folder of scripts, not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        "torchprof_demo_model", REPO / "integrations" / "demo" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Workload:
    """The demo GPT at ``s``'s size with AdamW; :meth:`step` is one optimizer step, waited for."""

    def __init__(self, s: Settings) -> None:
        torch.manual_seed(0)
        self.s = s
        model = demo_model_module().TinyGPT(
            vocab=s.vocab, hidden=s.hidden, layers=s.layers, heads=s.heads, seq_len=s.seq_len
        )
        self.model = model.to(device=s.device, dtype=s.dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.tokens = torch.randint(0, s.vocab, (s.batch, s.seq_len + 1), device=s.device)

    def step(self) -> None:
        logits = self.model(self.tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, self.s.vocab).float(), self.tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize(self.s)


def synchronize(s: Settings) -> None:
    if s.device == "cuda":
        torch.cuda.synchronize()


def activities(s: Settings) -> list[torch.profiler.ProfilerActivity]:
    found = [torch.profiler.ProfilerActivity.CPU]
    return found + [torch.profiler.ProfilerActivity.CUDA] if s.device == "cuda" else found


def timed_steps(
    work: Workload, count: int, after_step: Callable[[int], None] = lambda _i: None
) -> list[float]:
    """Wall seconds of ``count`` steps, each including ``after_step(i)`` (the profiler's step)."""
    times = []
    for index in range(count):
        started = time.perf_counter()
        work.step()
        after_step(index)
        times.append(time.perf_counter() - started)
    return times
