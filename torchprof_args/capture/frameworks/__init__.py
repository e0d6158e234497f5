"""The trainer integrations behind the short public entry modules: :mod:`torchprof_args.megatron`
(Megatron-LM's argument provider and checks, the loop hook, the patch of its training module, its
per-interval metrics), ``deepspeed`` (the engine hook), ``huggingface``, ``accelerate``, ``lightning`` and
``torchtitan``: one module per framework and concept; ``hosted_profiling`` and ``flag_fields`` are what
several of them share."""
