"""Pretrain a GPT with Megatron-LM, profiled by torchprof-args (a ``pretrain_gpt.py``-style entry).

Compared with Megatron-LM's own ``pretrain_gpt.py`` the profiling part is two lines: the
``install()`` call and the ``extra_args_provider``.  The data is synthetic (random tokens) so the
example runs anywhere; on a machine without CUDA the model's core attention is swapped for a CPU
one (see cpu_attention.py), everything else is megatron-core's GPTModel.

    torchrun --nproc_per_node 2 integrations/megatron/pretrain_gpt.py \\
        --tensor-model-parallel-size 2 --train-iters 8 --tensorboard-dir ./tb \\
        --torch-profile --torch-profile-parallel-ranks dp=0
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import torch
from megatron.core.enums import ModelType
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.training import get_args, pretrain

import torchprof_args.megatron

sys.path.insert(0, str(Path(__file__).resolve().parent))


def model_provider(pre_process: bool = True, post_process: bool = True) -> GPTModel:
    args = get_args()
    config = TransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        use_cpu_initialization=not torch.cuda.is_available(),
        gradient_accumulation_fusion=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
    )
    if torch.cuda.is_available():
        spec = get_gpt_layer_local_spec()
    else:
        from cpu_attention import cpu_gpt_layer_spec

        spec = cpu_gpt_layer_spec()
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.vocab_size,
                    max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
                    post_process=post_process)


class RandomTokens(torch.utils.data.Dataset):
    """Synthetic token sequences (deterministic per index)."""

    def __init__(self, num_samples: int, seq_length: int, vocab_size: int) -> None:
        self.num_samples, self.seq_length, self.vocab_size = num_samples, seq_length, vocab_size

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return {"text": torch.randint(0, self.vocab_size, (self.seq_length + 1,), generator=generator)}


def train_valid_test_datasets_provider(num_samples: list[int]) -> tuple[RandomTokens, None, None]:
    args = get_args()
    return RandomTokens(max(num_samples[0], 1), args.seq_length, args.vocab_size), None, None


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = (output_tensor.float() * loss_mask).sum() / loss_mask.sum()
    return loss, {"lm loss": loss.detach()}


def forward_step(data_iterator, model: GPTModel):  # noqa: ANN001, ANN201  (Megatron's contract)
    text = next(data_iterator)["text"]
    tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
    batch, seq = tokens.shape
    position_ids = torch.arange(seq).unsqueeze(0).expand(batch, -1)
    attention_mask = torch.ones(1, 1, seq, seq).tril() < 0.5
    output = model(tokens, position_ids, attention_mask, labels=labels)
    return output, partial(loss_func, torch.ones_like(labels, dtype=torch.float))


if __name__ == "__main__":
    torchprof_args.megatron.install()  # profile Megatron-LM's loop: no edit of its source
    pretrain(
        train_valid_test_datasets_provider,
        model_provider,
        ModelType.encoder_or_decoder,
        forward_step,
        extra_args_provider=torchprof_args.megatron.extra_args_provider,
    )
