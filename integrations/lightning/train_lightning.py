"""Train a small GPT with Lightning (DDP, gradient accumulation), profiled by torchprof-args.

    torchrun --nproc_per_node 2 integrations/lightning/train_lightning.py --log-dir logs \\
        --torch-profile --torch-profile-ranks all --torch-profile-step-start 3 --torch-profile-dir prof

Profiling is one callback (``TorchProfileCallback(args)``); its timers go to the CSV logger here
(``<log dir>/lightning_logs/version_0/metrics.csv``), and to any logger the Trainer has.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger

from torchprof_args import TorchProfileArgsError, add_torch_profile_args
from torchprof_args.capture.metrics.flops import transformer_flops_per_iteration
from torchprof_args.lightning import TorchProfileCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "demo"))
from model import TinyGPT  # noqa: E402


class GPTModule(pl.LightningModule):
    def __init__(self, vocab_size: int, seq_length: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.model = TinyGPT(vocab_size, 64, 2, 4, seq_length)
        #: model FLOPs of one batch of 4 (forward + backward), Lightning's ThroughputMonitor convention
        self.flops_per_batch = transformer_flops_per_iteration(
            num_layers=2, hidden_size=64, seq_length=seq_length, vocab_size=vocab_size, global_batch_size=4)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        tokens, targets = batch[:, :-1], batch[:, 1:]
        logits = self.model(tokens)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab_size), targets.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--accumulate-grad-batches", type=int, default=2)
    parser.add_argument("--log-dir", default="logs")
    parser.add_argument("--lightning-profiler", choices=("simple", "pytorch"),
                        help="Lightning's own profiler (refused with --torch-profile)")
    add_torch_profile_args(parser)
    args = parser.parse_args(argv)
    try:
        callback = TorchProfileCallback(args)
    except TorchProfileArgsError as err:
        parser.error(str(err))
    torch.manual_seed(0)
    seq_length, vocab_size = 32, 256
    data = torch.randint(0, vocab_size, (256, seq_length + 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = pl.Trainer(
        accelerator="cpu" if not torch.cuda.is_available() else "auto", strategy="ddp",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        max_steps=args.max_steps, accumulate_grad_batches=args.accumulate_grad_batches,
        log_every_n_steps=args.log_interval, logger=CSVLogger(args.log_dir), callbacks=[callback],
        profiler=args.lightning_profiler, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False)
    try:
        trainer.fit(GPTModule(vocab_size, seq_length), loader)
    except TorchProfileArgsError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    if trainer.is_global_zero:
        print(f"done at global step {trainer.global_step} ({args.accumulate_grad_batches} batches per step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
