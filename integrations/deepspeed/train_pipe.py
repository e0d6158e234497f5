"""Train a small GPT with DeepSpeed pipeline parallelism, profiled by torchprof-args.

    deepspeed --num_gpus 2 integrations/deepspeed/train_pipe.py \\
        --deepspeed_config configs/ds_pipe_config.json --torch-profile --torch-profile-dir ./prof
    # or: torchrun --nproc_per_node 2 integrations/deepspeed/train_pipe.py ... (CPU: DS_ACCELERATOR=cpu)

The model is a ``PipelineModule`` (embedding, blocks, head) cut into ``--pipeline-stages`` stages;
``engine.train_batch()`` runs ``gradient_accumulation_steps`` micro-batches through the pipeline
and takes one optimizer step.  ``torchprof_args.deepspeed.attach`` steps the profiler there, on
every stage: ``ProfilerStep#N`` is optimizer step N.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
import deepspeed  # noqa: E402
from deepspeed.pipe import LayerSpec, PipelineModule  # noqa: E402

import torchprof_args.deepspeed  # noqa: E402
from torchprof_args import TorchProfileArgsError, add_torch_profile_args  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))
from model import Block, synthetic_batches  # noqa: E402


class Embedding(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int, seq_len: int) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Parameter(torch.zeros(seq_len, hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tokens(tokens) + self.positions[: tokens.shape[1]]


class Head(torch.nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.out = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    parser.add_argument("--train-iters", type=int, default=6, help="optimizer steps in total")
    parser.add_argument("--pipeline-stages", type=int, default=2)
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser = deepspeed.add_config_arguments(parser)
    return add_torch_profile_args(parser)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # plain gloo; compile no op
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    torch.manual_seed(1234)
    layers = [LayerSpec(Embedding, args.vocab_size, args.hidden_size, args.seq_length),
              *(LayerSpec(Block, args.hidden_size, 4) for _ in range(args.num_layers)),
              LayerSpec(Head, args.hidden_size, args.vocab_size)]

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab_size), targets.reshape(-1))

    model = PipelineModule(layers=layers, num_stages=args.pipeline_stages, loss_fn=loss_fn,
                           partition_method="uniform")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    batches = synthetic_batches(args.vocab_size, args.seq_length, engine.train_micro_batch_size_per_gpu(),
                                seed=1234)
    try:
        hook = torchprof_args.deepspeed.attach(engine, args)
    except TorchProfileArgsError as err:
        print(f"train_pipe.py: error: {err}", file=sys.stderr)
        return 2
    with hook:
        while engine.global_steps < args.train_iters:
            loss = engine.train_batch(batches)  # all micro-batches, then one optimizer step
    if engine.is_last_stage():
        print(f"stage {engine.stage_id}: done at global step {engine.global_steps} "
              f"({engine.gradient_accumulation_steps()} micro-batches each), loss {loss.item():.3f}; "
              f"traces: {[Path(t).name for t in hook.prof.published_traces]}", flush=True)
    elif engine.is_first_stage():
        print(f"stage {engine.stage_id}: traces: {[Path(t).name for t in hook.prof.published_traces]}",
              flush=True)
    torch.distributed.destroy_process_group()  # gloo's threads joined before the interpreter exits
    return 0


if __name__ == "__main__":
    sys.exit(main())
