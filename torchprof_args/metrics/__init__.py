"""Step timers and metrics: Megatron-compatible ``Timers``, the ``MetricsWriter`` and its sinks
(wandb, TensorBoard, metrics.jsonl), model FLOPs, and the step-timing dashboard.
Import-light: torch, tensorboard and wandb load only when a sink or a CUDA timer needs them."""
