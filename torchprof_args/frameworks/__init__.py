"""The implementations behind the short framework entry points: :mod:`torchprof_args.megatron`
(Megatron-LM's argument provider and checks, the loop hook, the patch of its training module, its
per-interval metrics) and :mod:`torchprof_args.deepspeed` (the engine hook)."""
