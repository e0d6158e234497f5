"""The trainer integrations behind the short public entry modules (:mod:`torchprof_args.megatron`,
``deepspeed``, ``huggingface``, ``accelerate``, ``lightning``, ``torchtitan``): one module per framework
and concept; ``hosted_profiling`` and ``flag_fields`` are what several of them share."""
