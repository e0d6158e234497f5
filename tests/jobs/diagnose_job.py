"""A 2-rank gloo training job with one real performance problem, for ``torchprof diagnose``'s tests.

A small MLP in DistributedDataParallel (gloo, CPU), fed by a ``DataLoader`` (no worker process),
profiled by ``TorchProfiler`` with the flags given.  The problem is chosen on the command line:

* ``--loader-sleep-ms X``: the dataset's ``__getitem__`` sleeps X ms per batch (a slow data loader:
  the step waits in ``enumerate(DataLoader)``'s ``__next__``);
* ``--slow-rank R --slow-ms X``: rank R spends X ms more per step before its backward pass (a slow
  host), so the other rank waits for it in DDP's gradient all-reduce;
* ``--sync-mb N``: every step blocks on a wait it does not need: it all-reduces an N MB metric
  buffer asynchronously and waits for the result at once (``work.wait()``), so the step's thread sits
  idle while gloo's worker thread transfers it (the CPU form of a host synchronisation: the remedy
  is to wait where the value is needed, e.g. at the logging interval); ``--sync-later`` is that
  remedy: the step waits for the previous step's all-reduce instead, done long before;
* ``--loader-rank R``: only rank R's loader sleeps (default: every rank's);
* ``--slow-kind matmul``: the slow rank's extra time is matrix products (busy, like a rank with more
  work) rather than a sleep (a stalled host).

Writes ``--result-dir/rank<R>.json`` with how it ended.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


class SlowDataset(Dataset):
    """Random regression batches; each item costs ``sleep_ms`` of loading time."""

    def __init__(self, n: int, sleep_ms: float) -> None:
        self.n, self.sleep_ms = n, sleep_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1e3)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=generator), torch.randn(8, generator=generator)


def extra_work(ms: float, kind: str) -> None:
    """``ms`` of extra time in the step: a sleep, or matrix products for that long."""
    if kind == "sleep":
        time.sleep(ms / 1e3)
        return
    a = torch.randn(128, 128)
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--loader-sleep-ms", type=float, default=0.0)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--sync-mb", type=float, default=0.0)
    parser.add_argument("--sync-later", action="store_true")
    parser.add_argument("--loader-rank", type=int, default=-1)
    parser.add_argument("--slow-kind", choices=("sleep", "matmul"), default="sleep")
    parser.add_argument("--result-dir", required=True)
    add_torch_profile_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # one item per batch: the loader's sleep is paid once per step
    metrics = torch.zeros(int(args.sync_mb * (1 << 20)) // 4)
    sleep_ms = args.loader_sleep_ms if args.loader_rank in (-1, rank) else 0.0
    loader = DataLoader(SlowDataset(args.iters + 2, sleep_ms), batch_size=None, num_workers=0)
    pending = None
    with TorchProfiler.from_args(args) as prof:
        for iteration, (x, y) in enumerate(loader, start=1):
            if iteration > args.iters:
                break
            loss = torch.nn.functional.mse_loss(model(x.unsqueeze(0)), y.unsqueeze(0))
            if rank == args.slow_rank and args.slow_ms:
                extra_work(args.slow_ms, args.slow_kind)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if args.sync_mb:
                if pending is not None:  # --sync-later: the previous step's, long done
                    pending.wait()
                metrics[0] = loss.detach()
                pending = dist.all_reduce(metrics, async_op=True)
                if not args.sync_later:
                    pending.wait()
                    pending = None
            prof.step(iteration)
    if pending is not None:
        pending.wait()
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"), {"rank": rank, "ended": "done"})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # skip interpreter teardown (torch's C++ threads may abort there on this CPU build)
