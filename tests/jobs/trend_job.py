"""Training runs for tests/test_trend.py: each a small CPU MLP whose step is its compute plus a fixed
wait (a data loader's, say), logged every step by its own ``MetricsWriter`` into ``OUT/<run>/``.

    python tests/jobs/trend_job.py OUT --runs 10 --slower 3 --steps 50 --step-ms 15

``--runs`` runs with the same step, then one more, named ``slower``, whose wait is longer by
``--slower`` percent of the step; the slower run is placed at a random position among the others
(each process a fresh model and writer; one interpreter, so the runs differ by the machine's noise).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from torchprof_args import MetricsWriter
from torchprof_args.metrics.config import MetricsConfig


def run(folder: Path, steps: int, step_ms: float, slower_pct: float) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(8, 16)
    wait = step_ms * (0.95 + slower_pct / 100.0) / 1000.0  # the compute: about 5 % of the step
    writer = MetricsWriter(MetricsConfig(str(folder), sinks=("jsonl",)), rank=0, world_size=1, console=False)
    for step in range(1, steps + 1):
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(wait)
        writer.log_step(step)
    writer.close()


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
    names = [f"run{i:02d}" for i in range(1, args.runs + 1)]
    order = list(names)
    order.insert(random.Random(args.seed).randint(0, len(order)), "slower")
    for name in order:
        run(Path(args.out) / name, args.steps, args.step_ms, args.slower if name == "slower" else 0.0)


if __name__ == "__main__":
    main()
