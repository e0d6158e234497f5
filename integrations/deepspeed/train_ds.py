"""Train a small GPT with DeepSpeed (ZeRO, gradient accumulation), profiled by torchprof-args.

    deepspeed --num_gpus 2 integrations/deepspeed/train_ds.py --deepspeed_config configs/ds_config.json \\
        --torch-profile --torch-profile-dir ./prof
    # or: torchrun --nproc_per_node 2 integrations/deepspeed/train_ds.py ... (CPU: DS_ACCELERATOR=cpu)

Profiling adds one line around the loop (``with torchprof_args.deepspeed.attach(...)``); the
profiler steps on optimizer steps, not micro-steps.  ``--save-dir``/``--load-dir`` checkpoint
with DeepSpeed; after a resume the trace numbering continues from the checkpoint's global step.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

# DeepSpeed picks its accelerator at import time; without CUDA use its CPU accelerator.
os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
import deepspeed  # noqa: E402

import torchprof_args.deepspeed  # noqa: E402
from torchprof_args import MetricsWriter, TorchProfileArgsError, add_torch_profile_args  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))
from model import TinyGPT, synthetic_batches  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    parser.add_argument("--train-iters", type=int, default=6, help="optimizer steps in total")
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save-dir", help="save a DeepSpeed checkpoint here at the end")
    parser.add_argument("--load-dir", help="resume from the DeepSpeed checkpoint here")
    parser = deepspeed.add_config_arguments(parser)
    return add_torch_profile_args(parser)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op at init; plain gloo
        # is all this example needs, so mark that op unavailable instead of compiling it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    rank = torch.distributed.get_rank()
    torch.manual_seed(1234)
    model = TinyGPT(args.vocab_size, args.hidden_size, args.num_layers, 4, args.seq_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    if args.load_dir:
        engine.load_checkpoint(args.load_dir)
    batches = synthetic_batches(args.vocab_size, args.seq_length, engine.train_micro_batch_size_per_gpu(),
                                seed=1234 + rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    try:
        hook = torchprof_args.deepspeed.attach(engine, args, metrics=MetricsWriter.from_args(args))
    except TorchProfileArgsError as err:
        print(f"train_ds.py: error: {err}", file=sys.stderr)
        return 2
    with hook:
        while engine.global_steps < args.train_iters:
            tokens, targets = next(batches)
            logits = engine(tokens)
            loss = loss_fn(logits.reshape(-1, args.vocab_size), targets.reshape(-1))
            engine.backward(loss)
            engine.step()
    hook.metrics.close()
    if args.save_dir:
        engine.save_checkpoint(args.save_dir)
    if rank == 0:
        print(f"done at global step {engine.global_steps}; traces: {hook.prof.published_traces}", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # gloo's threads joined before the interpreter exits
    return 0


if __name__ == "__main__":
    sys.exit(main())
