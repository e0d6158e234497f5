"""Demo: train a small GPT on synthetic data with DDP over gloo, profiled by torchprof-args.

Run with ``torchrun --nproc_per_node 2 integrations/demo/train_lm.py --torch-profile ...`` (or
``make demo``).  It is also the model job the tests and benchmarks run on real ranks.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import TinyGPT, synthetic_batches  # noqa: E402

from torchprof_args import (  # noqa: E402
    MetricsWriter,
    Timers,
    TorchProfileArgsError,
    TorchProfiler,
    add_torch_profile_args,
)
from torchprof_args.capture.metrics.flops import transformer_flops_per_iteration  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    model = parser.add_argument_group("model and training")
    model.add_argument("--train-iters", type=int, default=8, help="optimizer steps to run in total")
    model.add_argument("--start-iteration", type=int, default=0,
                       help="iterations already done (simulates resuming from a checkpoint)")
    model.add_argument("--micro-batch-size", type=int, default=8)
    model.add_argument("--seq-length", type=int, default=64)
    model.add_argument("--hidden-size", type=int, default=128)
    model.add_argument("--num-layers", type=int, default=4)
    model.add_argument("--num-attention-heads", type=int, default=4)
    model.add_argument("--vocab-size", type=int, default=512)
    model.add_argument("--lr", type=float, default=3e-3)
    model.add_argument("--seed", type=int, default=1234)
    model.add_argument("--distributed-timeout", type=float, default=600.0,
                       help="process-group (collective) timeout in seconds")
    return add_torch_profile_args(parser)


def init_distributed(timeout_seconds: float) -> tuple[int, int]:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_seconds))
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank, world_size = init_distributed(args.distributed_timeout)
    try:
        prof = TorchProfiler.from_args(args, start_iteration=args.start_iteration)
    except TorchProfileArgsError as err:
        print(f"train_lm.py: error: {err}", file=sys.stderr)
        return 2
    global_batch = args.micro_batch_size * world_size
    timers = Timers.from_args(args)

    torch.manual_seed(args.seed)
    model = TinyGPT(args.vocab_size, args.hidden_size, args.num_layers, args.num_attention_heads,
                    args.seq_length)
    if world_size > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    batches = synthetic_batches(args.vocab_size, args.seq_length, args.micro_batch_size, args.seed + rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    writer = MetricsWriter.from_args(
        args, timers=timers, samples_per_iteration=global_batch,
        tokens_per_iteration=global_batch * args.seq_length,
        flops_per_iteration=transformer_flops_per_iteration(
            num_layers=args.num_layers, hidden_size=args.hidden_size, seq_length=args.seq_length,
            vocab_size=args.vocab_size, global_batch_size=global_batch,
            num_attention_heads=args.num_attention_heads),
    )

    with prof:
        for iteration in range(args.start_iteration + 1, args.train_iters + 1):
            started = time.perf_counter()
            timers("batch-generator", log_level=0).start()
            tokens, targets = next(batches)
            timers("batch-generator").stop()
            timers("forward-backward", log_level=0).start()
            logits = model(tokens)
            loss = loss_fn(logits.reshape(-1, args.vocab_size), targets.reshape(-1))
            loss.backward()
            timers("forward-backward").stop()
            timers("optimizer", log_level=0).start()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            timers("optimizer").stop()
            timers("profiler-step", log_level=0).start()
            prof.step(iteration)  # the trace flush happens inside, at flush iterations
            timers("profiler-step").stop()
            if iteration % args.log_interval == 0:
                writer.log_step(iteration, extra=prof.stats)  # one collective for all timers
            if rank == 0:
                print(f"iteration {iteration:4d}/{args.train_iters} | loss {loss.item():.4f} | "
                      f"{(time.perf_counter() - started) * 1e3:.1f} ms", flush=True)
    writer.close()

    if prof.published_traces:
        for path in prof.published_traces:
            print(f"rank {rank}: trace {path}", flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
