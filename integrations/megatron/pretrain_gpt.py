"""Megatron-LM's own GPT pretraining, profiled by torchprof-args (a drop-in for its ``pretrain_gpt.py``).

The model, data and loss are those of the ``pretrain_gpt.py`` in your Megatron-LM checkout, which
must be on ``PYTHONPATH``; this file is that script's ``__main__`` block plus the two lines that add
profiling: ``install()`` and the ``extra_args_provider``.  Megatron-LM changed how arguments reach
``pretrain()`` in core_v0.18.0, so both call shapes are below (core_v0.16 to main):

    PYTHONPATH=/path/to/Megatron-LM torchrun --nproc_per_node 8 integrations/megatron/pretrain_gpt.py \\
        <Megatron-LM flags> --torch-profile --torch-profile-step-start 100 --torch-profile-step-end 102
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

# `import pretrain_gpt` must find Megatron-LM's script, not this file's folder.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _HERE]

import pretrain_gpt as gpt  # noqa: E402  (Megatron-LM's own; its __main__ block does not run)
from megatron.core.enums import ModelType  # noqa: E402
from megatron.training import pretrain  # noqa: E402

import torchprof_args.megatron  # noqa: E402


def main() -> None:
    torchprof_args.megatron.install()  # profile Megatron-LM's loop: no edit of its source
    gpt.train_valid_test_datasets_provider.is_distributed = True
    run_pretrain, store = gpt.inprocess_restart.maybe_wrap_for_inprocess_restart(pretrain)
    args_provider = torchprof_args.megatron.compose_args_providers(
        gpt.add_modelopt_args if gpt.has_nvidia_modelopt else None,
        torchprof_args.megatron.extra_args_provider,
    )
    defaults = {"tokenizer_type": "GPT2BPETokenizer"}

    if not torchprof_args.megatron.pretrain_takes_config_container(pretrain):
        # Megatron-LM up to core_v0.17.x: pretrain() parses the arguments itself.
        run_pretrain(
            gpt.train_valid_test_datasets_provider,
            partial(gpt.model_provider, gpt.gpt_builder),
            ModelType.encoder_or_decoder,
            gpt.forward_step,
            args_defaults=defaults,
            extra_args_provider=args_provider,
            store=store,
            get_embedding_ranks=gpt.get_embedding_ranks,
        )
        return

    # core_v0.18.0 and later (main): parse and validate first, then pretrain(config container, ...).
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(extra_args_provider=args_provider, args_defaults=defaults)
    if gpt.has_nvidia_modelopt:
        gpt.maybe_enable_modelopt(args)
    if gpt.has_nvidia_modelopt and getattr(args, "modelopt_enabled", False):
        model_config = gpt_config_from_args(args, model_config_cls=gpt.ModelOptModelConfig)
    else:
        model_config = gpt_config_from_args(args)
    run_pretrain(
        pretrain_cfg_container_from_args(args, model_config),
        gpt.train_valid_test_datasets_provider,
        ModelType.encoder_or_decoder,
        gpt.forward_step,
        store=store,
        get_embedding_ranks=gpt.get_embedding_ranks,
    )


if __name__ == "__main__":
    main()
