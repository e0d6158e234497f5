"""Step timers and metrics in the job: Megatron-compatible ``Timers``, the ``MetricsWriter`` and its
sinks (wandb, TensorBoard, metrics.jsonl, Prometheus), model FLOPs and MFU, the goodput ledger (the
tools over metrics.jsonl, ``trend`` and ``dashboard``, are in ``analysis/``).
Import-light: torch, tensorboard and wandb load only when a sink or a CUDA timer needs them."""
