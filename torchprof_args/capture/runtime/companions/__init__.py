"""What a recorded window writes beside its trace, published with it into the cycle folder: PyTorch's
execution trace (:mod:`.execution_trace`), the MoE layers' routed tokens per expert
(:mod:`.expert_tokens`)."""
