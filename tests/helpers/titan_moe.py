"""A real torchtitan MoE layer (``torchtitan.models.common.moe.MoE``), tiny and on CPU, built from
torchtitan's own config classes, its router biased towards one expert; and the router's choices
as the truth to compare the recorded tokens per expert with."""

from __future__ import annotations

import torch
from torch import nn


def tiny_moe(dim: int, experts: int, *, hot: int, bias: float, seed: int = 0, hidden: int = 32) -> nn.Module:
    """torchtitan's MoE (top-1, sigmoid scores, no shared expert, load balancing's buffers on), its
    parameters small normal values, its routing bias ``expert_bias_E`` raised by ``bias`` for expert
    ``hot``: most tokens choose it (the share grows with ``bias``)."""
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import GroupedExperts, MoE, RoutedExperts, TokenChoiceTopKRouter
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

    config = MoE.Config(
        num_experts=experts, load_balance_coeff=1e-3,
        router=TokenChoiceTopKRouter.Config(num_experts=experts, top_k=1,
                                            gate=Linear.Config(in_features=dim, out_features=experts)),
        routed_experts=RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(dim=dim, hidden_dim=hidden, num_experts=experts),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=experts, top_k=1)))
    generator = torch.Generator().manual_seed(seed)
    moe = config.build()
    with torch.no_grad():
        for parameter in moe.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
        moe.expert_bias_E.zero_()
        moe.expert_bias_E[hot] = bias
        moe.tokens_per_expert_E.zero_()
    return moe.train()


class RouterChoices:
    """The experts torchtitan's router chose, per call of the MoE layer's forward (a forward hook on
    ``moe.router``; evaluations and the calls a recomputation makes in the backward are left out)."""

    def __init__(self, moe: nn.Module, experts: int) -> None:
        self.experts = experts
        self.calls: list[list[int]] = []
        #: the expert of each token (top-1) in the last counted call.
        self.last: torch.Tensor | None = None
        moe.router.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: object, output: tuple[torch.Tensor, ...]) -> None:
        if not module.training or (not torch.compiler.is_compiling()
                                   and torch._C._current_graph_task_id() != -1):  # noqa: SLF001
            return  # an evaluation (torchtitan counts none) or a recomputation in the backward
        ids = output[1].detach().flatten()
        self.last = ids
        self.calls.append(torch.bincount(ids, minlength=self.experts).tolist())

    def take(self) -> list[int]:
        """The tokens routed to each expert since the last take (summed over the calls)."""
        total = [sum(call[e] for call in self.calls) for e in range(self.experts)]
        self.calls.clear()
        return total
