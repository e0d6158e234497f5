"""Hugging Face ``Trainer`` integration (and TRL's trainers, built on it): flags and one callback.

    from transformers import HfArgumentParser, Trainer, TrainingArguments
    from torchprof_args.huggingface import TorchProfileArguments, TorchProfileCallback

    training_args, profile_args = HfArgumentParser(
        (TrainingArguments, TorchProfileArguments)).parse_args_into_dataclasses()
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset,
                      callbacks=[TorchProfileCallback(profile_args)])
    trainer.train()

:class:`TorchProfileArguments` holds every ``--torch-profile-*`` and ``--metrics-*`` flag (both
``--torch-profile-step-start`` and ``--torch_profile_step_start`` parse), checked when parsed: a
bad value or combination ends the parse with one ``error:`` line naming the flag.  The Trainer's
own options own logging: ``--logging_steps`` is the log interval, ``--report_to`` the sinks.

:class:`TorchProfileCallback` steps the profiler on optimizer steps (``ProfilerStep#N`` is
``state.global_step`` N; gradient accumulation and resumed checkpoints handled), fences every flush,
and adds the step timers, ``iteration-time``, ``throughput`` (TFLOP/s per GPU from the Trainer's
``floating_point_ops``) and ``mfu`` to the Trainer's logs, so ``trainer.state.log_history`` and every
``report_to`` sink get them; the traces record the Trainer's parallel layout.  TRL's ``SFTTrainer``
(a ``Trainer``) takes the same callback.  Install with the ``huggingface`` extra.
"""

from torchprof_args.capture.frameworks.huggingface_args import (
    TorchProfileArguments,
    TorchProfileArgumentsBase,
)
from torchprof_args.capture.frameworks.huggingface_callback import FLUSH_TIMER, TorchProfileCallback

__all__ = ["FLUSH_TIMER", "TorchProfileArguments", "TorchProfileArgumentsBase", "TorchProfileCallback"]
