"""Train a tiny GPT-2 (random weights from a config: nothing is downloaded) with Hugging Face's
``Trainer``, or TRL's ``SFTTrainer`` (``--trainer sft``), profiled by torchprof-args.

    torchrun --nproc_per_node 2 integrations/huggingface/train_gpt2.py --output_dir out \\
        --max_steps 6 --gradient_accumulation_steps 2 --logging_steps 2 --report_to none \\
        --torch-profile --torch-profile-ranks all --torch-profile-step-start 3 --torch-profile-dir prof

Profiling takes two lines: ``TorchProfileArguments`` in the parser, ``TorchProfileCallback`` in the
trainer's callbacks.  On CPU the ranks talk over gloo (Accelerate picks it without CUDA).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments

from torchprof_args.huggingface import TorchProfileArguments, TorchProfileCallback


@dataclasses.dataclass
class ScriptArguments:
    trainer: str = dataclasses.field(default="trainer", metadata={"choices": ["trainer", "sft"],
                                     "help": "transformers' Trainer, or TRL's SFTTrainer"})
    seq_length: int = 32
    samples: int = 64
    vocab_size: int = 256
    result_file: str | None = dataclasses.field(
        default=None, metadata={"help": "write the trainer's log history (JSON) here, on rank 0"})


def token_dataset(samples: int, seq_length: int, vocab_size: int) -> list[dict[str, list[int]]]:
    """Random token sequences (the same on every rank: the sampler splits them)."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab_size, (samples, seq_length), generator=generator)
    return [{"input_ids": row.tolist(), "labels": row.tolist()} for row in tokens]


def tiny_gpt2(vocab_size: int, seq_length: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab_size, n_positions=seq_length, n_embd=64, n_layer=2, n_head=4)
    return GPT2LMHeadModel(config)


def build_trainer(script: ScriptArguments, training_args: TrainingArguments,
                  profile_args: TorchProfileArguments) -> Trainer:
    model = tiny_gpt2(script.vocab_size, script.seq_length)
    rows = token_dataset(script.samples, script.seq_length, script.vocab_size)
    callbacks = [TorchProfileCallback(profile_args)]
    if script.trainer == "sft":
        from datasets import Dataset
        from trl import SFTTrainer

        return SFTTrainer(model=model, args=training_args, train_dataset=Dataset.from_list(rows),
                          processing_class=word_tokenizer(script.vocab_size), callbacks=callbacks)
    return Trainer(model=model, args=training_args, train_dataset=rows, callbacks=callbacks)


def word_tokenizer(vocab_size: int):
    """A tokenizer made here (SFTTrainer wants one for padding): words t0..tN, nothing downloaded."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size - 1)} | {"<pad>": vocab_size - 1}
    backend = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<pad>")


def parse(argv: list[str] | None):
    """(script, training, profile) arguments; SFTConfig instead of TrainingArguments with --trainer sft."""
    argv = sys.argv[1:] if argv is None else argv
    config_class = TrainingArguments
    sft = "--trainer=sft" in argv or any(a == "--trainer" and argv[i + 1:i + 2] == ["sft"]
                                         for i, a in enumerate(argv))
    if sft:
        from trl import SFTConfig

        config_class = SFTConfig
    parser = HfArgumentParser((ScriptArguments, config_class, TorchProfileArguments))
    return parser.parse_args_into_dataclasses(argv)


def main(argv: list[str] | None = None) -> int:
    script, training_args, profile_args = parse(argv)
    trainer = build_trainer(script, training_args, profile_args)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if trainer.is_world_process_zero():
        history = trainer.state.log_history
        last = [entry for entry in history if "loss" in entry][-1]
        mfu = f"{last['mfu']:.3g} %" if "mfu" in last else "n/a"
        print(f"done at global step {trainer.state.global_step}; step {last['step']}: "
              f"iteration-time {last['iteration-time'] * 1000:.0f} ms, "
              f"TFLOP/s/GPU {last.get('throughput', float('nan')):.3g}, MFU {mfu}")
        if script.result_file:
            with open(script.result_file, "w") as handle:
                json.dump(history, handle)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
