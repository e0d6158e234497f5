"""Model FLOPs of a GPT-style transformer iteration, for TFLOP/s per GPU."""

from __future__ import annotations

__all__ = ["transformer_flops_per_iteration"]


def transformer_flops_per_iteration(
    *,
    num_layers: int,
    hidden_size: int,
    seq_length: int,
    vocab_size: int,
    global_batch_size: int,
    ffn_hidden_size: int | None = None,
    num_attention_heads: int | None = None,
    kv_channels: int | None = None,
    num_query_groups: int | None = None,
    swiglu: bool = False,
) -> float:
    """Model FLOPs of one training iteration (forward + backward) of a GPT-style transformer.

    Counts the matrix multiplications the way Megatron-LM's ``num_floating_point_operations``
    does (dense model): per token and layer the forward pass does ``2*h*(q + 2*kv)`` for the
    Q/K/V projections, ``2*2*s*q`` for scores and their product with V, ``2*q*h`` for the output
    projection and ``2*2*h*f`` for the MLP (x1.5 with SwiGLU's three matrices); the logits add
    ``2*h*vocab`` per token; backward costs twice the forward.
    """
    heads = num_attention_heads or max(1, hidden_size // 64)
    channels = kv_channels or hidden_size // heads
    groups = num_query_groups or heads
    query = heads * channels
    key_value = groups * channels
    ffn = ffn_hidden_size or 4 * hidden_size
    gated = 1.5 if swiglu else 1.0
    per_token_layer = (
        2 * hidden_size * (query + 2 * key_value)
        + 4 * seq_length * query
        + 2 * query * hidden_size
        + 4 * hidden_size * ffn * gated
    )
    per_token = num_layers * per_token_layer + 2 * hidden_size * vocab_size
    return 3.0 * global_batch_size * seq_length * per_token
