"""A CPU stand-in for megatron-core's local ``DotProductAttention`` (``core_attention``).

megatron-core's local attention takes its score buffer from a CUDA-only global memory buffer and
forks the CUDA RNG tracker for attention dropout, so a GPTModel with the local layer spec cannot
run its attention on a CPU-only machine.  This module swaps in for ``core_attention`` through the
layer spec (the same mechanism that chooses Transformer Engine or local modules): the rest of the
model, tensor-parallel linears and vocab-parallel cross entropy included, is megatron-core's own.
Attention dropout is not applied (use ``attention_dropout=0``).  Only for CPU tests and demos.
"""

from __future__ import annotations

import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.spec_utils import ModuleSpec


class CPUDotProductAttention(DotProductAttention):
    """Causal scaled-dot-product attention on [seq, batch, heads, head_dim] inputs."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):  # noqa: ANN001, ANN201  (megatron-core's signature)
        if packed_seq_params is not None:
            raise ValueError("CPUDotProductAttention does not support packed sequences")
        heads = self.num_attention_heads_per_partition
        if key.size(2) != heads:  # grouped-query attention: repeat key/value heads
            key = key.repeat_interleave(heads // key.size(2), dim=2)
            value = value.repeat_interleave(heads // value.size(2), dim=2)
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        context = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   scale=self.softmax_scale)
        # [b, n, s, d] -> [s, b, n * d]
        return context.permute(2, 0, 1, 3).reshape(context.size(2), context.size(0), self.hidden_size_per_partition)


def cpu_gpt_layer_spec() -> ModuleSpec:
    """megatron-core's local GPT layer spec with :class:`CPUDotProductAttention` as core attention."""
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = CPUDotProductAttention
    return spec
