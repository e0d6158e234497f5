"""The implementations behind the short framework entry points (:mod:`torchprof_args.megatron`):
Megatron-LM's argument provider and checks, the loop hook, and the patch of its training module."""
