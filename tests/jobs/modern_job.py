"""The jobs users launch in 2026, small enough for 2 gloo ranks on CPU: FSDP2, compiled, and MoE.

``--shape fsdp2``: a 4-block transformer (attention-free: each block ``x + W2 relu(W1 norm(x))``, so
the numbers stay analytic), each block and the root sharded with FSDP2's ``fully_shard``, trained
with AdamW.  Per rank, the analytic sizes: parameters ``P / world`` bytes (each parameter's shard:
dim 0 split evenly), AdamW's state ``2 P / world``.

``--shape fsdp2-compiled``: the same, each block ``torch.compile``\\ d before it is sharded
(torchtitan's order).

``--shape moe``: a 2-layer Mixture-of-Experts model, expert parallel: 4 experts, 2 per rank, top-1,
the router biased so that ``--hot-share`` of the tokens go to rank 1's experts (``--balanced``: every
expert gets the same share of every rank's tokens, the re-run an aux-loss-balanced router would
give; ``--expert-us-per-token U``: each rank's experts also take U us per token they received, a
wait as an accelerator's expert kernels would be, so that two ranks on a small CPU do not share its
cores for their expert work); tokens travel to
their expert's rank by ``all_to_all_single_autograd`` (dispatch) and back (combine), with
variable split sizes; the dense parts' gradients are all-reduced by hand.

``--titan-router`` (MoE): each layer's tokens are routed by a real torchtitan MoE layer
(``tests/helpers/titan_moe.py``: torchtitan's ``MoE`` built from its config classes, top-1 over the 4
experts, its routing bias raised for expert 2, rank 1's first: most tokens choose it) whose output
is added to the layer's; the profiler watches those layers (``prof.watch_experts``, the world as the
expert-parallel group), and the job counts the router's choices per step and layer itself
(``titan_routed_per_step``).  Layer 0's ``tokens_per_expert_E`` is zeroed after each step (as
torchtitan's load balancing does), layer 1's never.

Profiled by ``TorchProfiler`` with the flags given; writes ``--result-dir/rank<R>.json`` with the
analytic sizes and the tokens each rank's experts received.

``--megatron-tpe-dir DIR`` (MoE): each step's tokens per local expert and layer handed to Megatron-LM's
own tokens-per-expert logger (``megatron.training.activation_logging``, core_v0.19.0 on: the hook
``--save-tokens-per-expert-interval`` puts on each MoE layer's ``experts.linear_fc1``, which needs
Transformer Engine's grouped linear, so it is called here), which writes ``DIR/tokens_per_expert/
rank<R>.jsonl`` as a Megatron-LM run does; Megatron-LM must be importable (``PYTHONPATH``).
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


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Transformer(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ExpertParallelMoE(nn.Module):
    """Top-1 routing to ``experts`` experts, ``experts / world`` on each rank; dispatch and combine by
    all-to-all with the split sizes the router gives."""

    def __init__(self, dim: int, experts: int, hot_share: float, rank: int, world: int,
                 generator: torch.Generator, balanced: bool = False, us_per_token: float = 0.0) -> None:
        super().__init__()
        self.rank, self.world, self.experts = rank, world, experts
        self._generator = generator
        self.local = experts // world
        self.router = nn.Linear(dim, experts)
        self.hot_share = hot_share
        self.balanced = balanced
        self.us_per_token = us_per_token
        self.expert_weights = nn.ParameterList(
            nn.Parameter(torch.randn(dim, dim) / dim**0.5) for _ in range(self.local))
        self.titan: nn.Module | None = None  # --titan-router: torchtitan's MoE layer routes the tokens
        self.titan_out: torch.Tensor | None = None

    def use_titan_router(self, seed: int) -> None:
        from helpers.titan_moe import RouterChoices, tiny_moe

        self.titan = tiny_moe(self.router.in_features, self.experts, hot=self.local, bias=0.15, seed=seed)
        self.choices = RouterChoices(self.titan, self.experts)

    def route(self, x: torch.Tensor) -> torch.Tensor:
        """The expert of each token: the router's choice, biased so that ``hot_share`` of the tokens go
        to the last rank's experts (a router that learned an imbalance); balanced: token ``i`` to expert
        ``i mod experts``, every expert the same share."""
        if self.balanced:
            return torch.arange(x.shape[0]) % self.experts
        if self.titan is not None:  # torchtitan's router chose (its MoE layer's forward, counted)
            self.titan_out = self.titan(x.unsqueeze(0)).squeeze(0)
            assert self.choices.last is not None
            return self.choices.last
        choice = self.router(x).argmax(dim=-1)
        hot = torch.rand(x.shape[0], generator=self._generator) < self.hot_share
        last_rank_first_expert = (self.world - 1) * self.local
        return torch.where(hot, last_rank_first_expert + choice % self.local, choice)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        expert = self.route(x)
        order = torch.argsort(expert)
        sent = x[order] * torch.softmax(self.router(x[order]), dim=-1).max(dim=-1, keepdim=True).values
        per_rank = torch.bincount(expert // self.local, minlength=self.world)
        send_splits = per_rank.tolist()
        counts = torch.empty_like(per_rank)
        dist.all_to_all_single(counts, per_rank)
        recv_splits = counts.tolist()
        group = dist.group.WORLD
        received = all_to_all_single_autograd(sent, recv_splits, send_splits, group)
        received_experts = self._received_experts(expert[order], send_splits, recv_splits)
        out = torch.zeros_like(received)
        self.tokens_per_expert = []  # what each local expert received: Megatron's tokens_per_expert
        for index, weight in enumerate(self.expert_weights):
            mask = received_experts == self.rank * self.local + index
            out[mask] = torch.relu(received[mask] @ weight)
            self.tokens_per_expert.append(int(mask.sum()))
        if self.us_per_token:  # the experts' kernels on a device: time per token, no CPU core taken
            time.sleep(received.shape[0] * self.us_per_token / 1e6)
        back = all_to_all_single_autograd(out, send_splits, recv_splits, group)
        combined = torch.empty_like(back)
        combined[order] = back
        if self.titan_out is not None:
            combined = combined + self.titan_out
            self.titan_out = None
        return combined, int(sum(recv_splits))

    def _received_experts(self, sorted_experts: torch.Tensor, send_splits: list[int],
                          recv_splits: list[int]) -> torch.Tensor:
        """The expert id of each received token (sent alongside, as its own all-to-all)."""
        ids = sorted_experts.to(torch.float32).unsqueeze(1)
        received = torch.empty(sum(recv_splits), 1)
        dist.all_to_all_single(received, ids, recv_splits, send_splits)
        return received.squeeze(1).to(torch.long)


class MoEModel(nn.Module):
    def __init__(self, dim: int, layers: int, experts: int, hot_share: float, rank: int, world: int,
                 balanced: bool = False, us_per_token: float = 0.0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own tokens' routes
        self.moes = nn.ModuleList(ExpertParallelMoE(dim, experts, hot_share, rank, world, generator, balanced,
                                                    us_per_token)
                                  for _ in range(layers))
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        received = 0
        for moe in self.moes:
            out, tokens = moe(x)
            x = x + out
            received += tokens
        return self.head(x), received


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=("fsdp2", "fsdp2-compiled", "moe"), required=True)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256, help="tokens per rank and step")
    parser.add_argument("--hot-share", type=float, default=0.8)
    parser.add_argument("--balanced", action="store_true",
                        help="MoE: every expert the same share of the tokens (the balanced router's re-run)")
    parser.add_argument("--expert-us-per-token", type=float, default=0.0,
                        help="MoE: each rank's experts also wait this many us per token received")
    parser.add_argument("--result-dir", required=True)
    parser.add_argument("--titan-router", action="store_true",
                        help="MoE: torchtitan's MoE layers route the tokens (watched by the profiler)")
    parser.add_argument("--megatron-tpe-dir", default=None,
                        help="MoE: tokens per expert by Megatron-LM's own writer, into DIR/tokens_per_expert")
    add_torch_profile_args(parser)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    received_tokens: list[int] = []
    result: dict[str, object] = {"rank": rank, "shape": args.shape}
    if args.shape == "moe":
        model: nn.Module = MoEModel(args.dim, 2, 4, args.hot_share, rank, world, args.balanced,
                                    args.expert_us_per_token)
        if args.titan_router:
            for index, moe in enumerate(model.moes):
                moe.use_titan_router(seed=index)  # replicated, as a real router
        dense = [p for name, p in model.named_parameters() if "expert_weights" not in name]
    else:
        from torch.distributed.fsdp import fully_shard

        model = Transformer(args.dim, args.layers)
        total = 4 * sum(p.numel() for p in model.parameters())
        for index, block in enumerate(model.blocks):
            if args.shape == "fsdp2-compiled":
                block = torch.compile(block)  # noqa: PLW2901 - torchtitan's order: compile, then shard
                model.blocks[index] = block
            fully_shard(block)
        fully_shard(model)
        shard = 4 * sum(p.to_local().numel() for p in model.parameters())
        result.update(parameter_bytes=shard, optimizer_state_bytes=2 * shard, unsharded_parameter_bytes=total)
        dense = []
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tpe_logger = None
    if args.megatron_tpe_dir and isinstance(model, MoEModel):
        from megatron.training.activation_logging import ActivationLogger

        tpe_logger = ActivationLogger(args.megatron_tpe_dir)
        hooks = [tpe_logger._make_tpe_hook("", f"decoder.layers.{i}.mlp.experts.linear_fc1")
                 for i in range(len(model.moes))]
    titan_routed: list[list[list[int]]] = []
    with TorchProfiler.from_args(args) as prof:
        if args.titan_router:
            assert prof.watch_experts(model, ep_ranks=list(range(world))) == 2
        for iteration in range(1, args.iters + 1):
            optimizer.zero_grad()
            x = torch.randn(args.batch, args.dim)
            if args.shape == "moe":
                out, tokens = model(x)
                received_tokens.append(tokens)
                if tpe_logger is not None:  # as the hook on linear_fc1 gets them: (input, tokens_per_expert)
                    for hook, moe in zip(hooks, model.moes, strict=True):
                        hook(None, (x, list(moe.tokens_per_expert)), {}, None)
                    tpe_logger.save_tpe(iteration)
            else:
                out = model(x)
            loss = out.square().mean()
            loss.backward()
            for parameter in dense:  # data parallel over the dense parts
                dist.all_reduce(parameter.grad)
                parameter.grad /= world
            optimizer.step()
            if args.titan_router:
                moes = [moe for moe in model.moes if moe.titan is not None]
                titan_routed.append([moe.choices.take() for moe in moes])
                moes[0].titan.tokens_per_expert_E.zero_()  # load balancing's pre-hook; layer 1: never
            prof.step(iteration)
    result.update(ended="done", received_tokens_per_step=received_tokens, titan_routed_per_step=titan_routed)
    write_json_atomically(os.path.join(args.result_dir, f"rank{rank}.json"), result)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # skip interpreter teardown (torch's C++ threads may abort there on this CPU build)
