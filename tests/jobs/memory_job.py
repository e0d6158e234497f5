"""A training job of known memory, for ``torchprof mem``'s tests: every byte is predictable.

An MLP ``dim -> 2 dim -> 2 dim -> dim`` (ReLU between, fp32) trained with Adam on random batches of
``--batch`` rows, loss ``out.square().mean()`` (it saves only ``out``), on every rank of a gloo job
(no DDP: each rank's gradients are exactly its parameters' size).  The analytic sizes, per rank:

* parameters ``P = 4 * (dim*2dim + 2dim + 2dim*2dim + 2dim + 2dim*dim + dim)`` bytes, gradients ``P``,
  Adam's state ``2 P``;
* activations saved for the backward pass ``4 * batch * (2dim + 2dim + dim)`` (both ReLU outputs and
  the output).

The problem is chosen on the command line: ``--keep-mb X --keep-ranks R...``: those ranks append a new
X MB tensor to a list every step and never free it (a tensor kept past its use).  Profiled by
``TorchProfiler`` with the flags given; writes ``--result-dir/rank<R>.json`` with the analytic sizes.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--keep-mb", type=float, default=0.0)
    parser.add_argument("--keep-ranks", type=int, nargs="*", default=[])
    parser.add_argument("--result-dir", required=True)
    add_torch_profile_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dim = args.dim
    linear = torch.nn.Linear
    relu = torch.nn.ReLU
    model = torch.nn.Sequential(linear(dim, 2 * dim), relu(), linear(2 * dim, 2 * dim), relu(),
                                linear(2 * dim, dim))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    kept: list[torch.Tensor] = []
    keep = rank in args.keep_ranks and args.keep_mb > 0
    with TorchProfiler.from_args(args) as prof:
        for iteration in range(1, args.iters + 1):
            optimizer.zero_grad()
            out = model(torch.randn(args.batch, dim))
            loss = out.square().mean()
            loss.backward()
            optimizer.step()
            if keep:
                kept.append(torch.ones(int(args.keep_mb * (1 << 20)) // 4))  # kept past its use
            total = loss.detach().clone()
            dist.all_reduce(total)
            prof.step(iteration)
    params = 4 * sum(p.numel() for p in model.parameters())
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"), {
        "rank": rank, "ended": "done", "parameter_bytes": params, "gradient_bytes": params,
        "optimizer_state_bytes": 2 * params, "activation_bytes": 4 * args.batch * 5 * dim,
        "kept_bytes_per_step": int(args.keep_mb * (1 << 20)) // 4 * 4 if keep else 0})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # skip interpreter teardown (torch's C++ threads may abort there on this CPU build)
