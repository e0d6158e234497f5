"""Train a small GPT with Hugging Face Accelerate (gradient accumulation), profiled by torchprof-args.

    accelerate launch --num_processes 2 integrations/accelerate/train_accelerate.py \\
        --torch-profile --torch-profile-ranks all --torch-profile-step-start 3 --torch-profile-dir prof
    # or: torchrun --nproc_per_node 2 integrations/accelerate/train_accelerate.py ... (CPU: gloo)

The profiler steps when ``accelerator.sync_gradients`` is true: once per optimizer step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

import torchprof_args.accelerate
from torchprof_args import MetricsWriter, Timers, TorchProfileArgsError, add_torch_profile_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))
from model import TinyGPT, synthetic_batches  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-iters", type=int, default=6, help="optimizer steps")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--vocab-size", type=int, default=256)
    return add_torch_profile_args(parser)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    model = TinyGPT(args.vocab_size, 64, 2, 4, args.seq_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = synthetic_batches(args.vocab_size, args.seq_length, 4, seed=accelerator.process_index)
    try:
        prof = torchprof_args.accelerate.profiler(accelerator, args)
    except TorchProfileArgsError as err:
        parser.error(str(err))
    timers = Timers.from_args(args)
    writer = MetricsWriter.from_args(args, timers=timers, tokens_per_iteration=4 * args.seq_length
                                     * accelerator.num_processes * args.gradient_accumulation_steps)
    step = micro_batches = 0
    with prof, writer:
        while step < args.train_iters:
            tokens, targets = next(batches)
            micro_batches += 1
            with accelerator.accumulate(model):
                timers("forward-backward", log_level=0).start()
                logits = model(tokens)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab_size),
                                                         targets.reshape(-1))
                accelerator.backward(loss)
                timers("forward-backward").stop()
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:  # the last micro-batch of the window: an optimizer step
                step += 1
                prof.step(step)
                if step % args.log_interval == 0:
                    writer.log_step(step, extra=prof.stats)
    if accelerator.is_main_process:
        print(f"done: {step} optimizer steps of {args.gradient_accumulation_steps} micro-batches "
              f"({micro_batches} micro-batches per rank); traces: {prof.published_traces}")
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
