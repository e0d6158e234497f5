"""Training runs for tests/test_trend.py and the operations guide: each a small CPU MLP whose step is its
compute plus a fixed wait (a data loader's, say), logged every step by its own ``MetricsWriter`` into
``OUT/<run>/metrics.jsonl``.

    python tests/jobs/trend_job.py OUT --runs 10 --slower 3 --steps 50 --step-ms 15

``--runs`` runs with the same step (``run01``...), and one more, ``slower``, whose wait is longer by
``--slower`` percent of the step.  The runs take their steps in turn, in a new random order every
round, each step timed on its own (``log_step(iteration_time=...)``): on a machine shared with other
jobs the load drifts by several percent within seconds, and runs taken one after the other would
differ by that drift, not by their code; taken in turn, every run sees the same load, and what
differs between them is the noise of their own steps.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from torchprof_args import MetricsWriter
from torchprof_args.capture.metrics.config import MetricsConfig


class Run:
    """One training run: its model, optimizer, wait per step and metrics writer."""

    def __init__(self, folder: Path, step_ms: float, slower_pct: float) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.inputs = torch.randn(8, 16)
        self.wait = step_ms * (0.95 + slower_pct / 100.0) / 1000.0  # the compute: about 5 % of the step
        config = MetricsConfig(str(folder), sinks=("jsonl",))
        self.writer = MetricsWriter(config, rank=0, world_size=1, console=False)

    def step(self, iteration: int) -> None:
        started = time.perf_counter()
        self.model(self.inputs).square().mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        time.sleep(self.wait)
        self.writer.log_step(iteration, iteration_time=time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--slower", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--step-ms", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = {f"run{i:02d}": 0.0 for i in range(1, args.runs + 1)} | {"slower": args.slower}
    started = {name: Run(Path(args.out) / name, args.step_ms, pct) for name, pct in runs.items()}
    order = list(started)
    rng = random.Random(args.seed)
    for iteration in range(1, args.steps + 1):
        rng.shuffle(order)
        for name in order:
            started[name].step(iteration)
    for run in started.values():
        run.writer.close()


if __name__ == "__main__":
    main()
