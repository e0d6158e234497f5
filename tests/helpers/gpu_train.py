"""A small training job on a CUDA device for the GPU tests: the demo's GPT, AdamW, real kernels.

Small on purpose (a few ms per step on an H100 or H200): the tests check what the profiler does
with CUDA, not the model.  ``device="cpu"`` runs the same code without a GPU.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

import torch

from helpers.demo_model import TinyGPT, synthetic_batches
from torchprof_args import add_torch_profile_args


def parse_flags(*argv: str) -> argparse.Namespace:
    """The package's flags parsed from ``argv`` (a parser with only torchprof-args' groups)."""
    return add_torch_profile_args(argparse.ArgumentParser()).parse_args(list(argv))


class Trainer:
    """One optimizer step per :meth:`step` on ``device``; batches are copied from the host each step."""

    def __init__(
        self,
        device: str = "cuda",
        *,
        vocab: int = 1024,
        hidden: int = 256,
        layers: int = 4,
        seq_len: int = 128,
        batch: int = 8,
        seed: int = 0,
    ) -> None:
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.vocab = vocab
        self.model = TinyGPT(vocab=vocab, hidden=hidden, layers=layers, heads=4, seq_len=seq_len).to(
            self.device
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self._batches = synthetic_batches(vocab, seq_len, batch, seed=seed)

    def step(self) -> None:
        tokens, targets = (t.to(self.device, non_blocking=True) for t in next(self._batches))
        logits = self.model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def train(
    prof, trainer: Trainer, iterations: Iterable[int], inside: Callable[[int], None] | None = None
) -> None:
    """``with prof:`` one step per iteration, then ``prof.step(iteration)``; ``inside(iteration)``
    runs after the step's work (timers, extra checks)."""
    with prof:
        for iteration in iterations:
            trainer.step()
            if inside is not None:
                inside(iteration)
            prof.step(iteration)
