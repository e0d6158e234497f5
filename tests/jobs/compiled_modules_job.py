"""A model compiled whole (one graph for all its layers), to tell which layer each kernel inductor
generated came from (``--torch-profile-compiled-modules``), on gloo ranks on CPU.

``layers.0`` and ``layers.1`` have the same shape (attention-free: ``attn`` is a norm, a projection and
a squashing function, ``mlp`` up, ReLU, down), so that their kernels share code (both ReLUs call one
``cpp_fused_relu_N``), except the squashing function: ``sigmoid`` in layer 0, ``tanh`` in layer 1, so
a test can tell them apart by name (the analysis does not: it reads the map).  ``--heavy N``
applies layer 0's sigmoid N times: its ``attn`` kernel takes more time.  Trained with SGD, data
parallel; writes ``--result-dir/rank<R>.json`` with each graph's compile time.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from torchprof_args import TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import write_json_atomically


class Attn(nn.Module):
    def __init__(self, dim: int, squash: str, repeat: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.squash, self.repeat = squash, repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x))
        for _ in range(self.repeat):
            h = torch.sigmoid(h) if self.squash == "sigmoid" else torch.tanh(h)
        return x + h


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Layer(nn.Module):
    def __init__(self, dim: int, squash: str, repeat: int) -> None:
        super().__init__()
        self.attn = Attn(dim, squash, repeat)
        self.mlp = Mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


class Model(nn.Module):
    def __init__(self, dim: int, heavy: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(dim, "sigmoid", heavy), Layer(dim, "tanh", 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--heavy", type=int, default=1, help="layer 0's sigmoid applied N times")
    parser.add_argument("--result-dir", required=True)
    add_torch_profile_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model(args.dim, args.heavy)
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    first_step_s = 0.0
    with TorchProfiler.from_args(args) as prof:
        for iteration in range(1, args.iters + 1):
            started = time.perf_counter()
            optimizer.zero_grad()
            loss = compiled(torch.randn(args.batch, args.dim)).square().mean()
            loss.backward()
            for parameter in model.parameters():  # data parallel by hand
                dist.all_reduce(parameter.grad)
            optimizer.step()
            if iteration == 1:
                first_step_s = time.perf_counter() - started  # the forward's and backward's compiles
            prof.step(iteration)
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"),
                          {"rank": rank, "ended": "done", "first_step_s": first_step_s})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # skip interpreter teardown (torch's C++ threads may abort there on this CPU build)
