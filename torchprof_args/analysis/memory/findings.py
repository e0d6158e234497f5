"""What to change to fit: memory findings, each with the bytes it would free and its remedy.

A finding is computed from one rank's breakdown at its peak (:class:`~.categories.DeviceMemory`):

* ``smaller_micro_batch``: activations scale with the micro-batch, so halving it frees half of the
  activations held at the peak (keep the global batch with twice the gradient accumulation);
* ``activation_recomputation``: recomputing activations in the backward pass frees *up to* the
  activations held at the peak (each checkpointed block still keeps its input);
* ``optimizer_sharding`` / ``gradient_sharding``: sharding the optimizer state (ZeRO-1, Megatron's
  distributed optimizer, FSDP) or the gradients too (ZeRO-2, FSDP) over ``N`` data-parallel ranks
  frees ``1 - 1/N`` of them (not on an FSDP2 job: they are sharded already);
* ``fragmentation``: the allocator's reserved but unallocated memory at the peak (CUDA), made usable
  by expandable segments;
* ``retained_tensor``: a tensor allocated every step and never freed (:class:`~.categories.Retained`),
  with its site.

Findings are ranked by the bytes they would free, largest first.
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchprof_args.analysis.memory.categories import ByCategory, DeviceMemory, human_bytes

__all__ = ["MIN_FINDING_BYTES", "REMEDIES", "MemoryFinding", "category_remedies", "findings_of"]

#: findings that would free less than this are not reported.
MIN_FINDING_BYTES = 1 << 20

#: each kind's remedy, one line.
REMEDIES = {
    "smaller_micro_batch": "halve the micro-batch and double the gradient accumulation steps (Megatron "
                           "--micro-batch-size; DeepSpeed train_micro_batch_size_per_gpu)",
    "activation_recomputation": "recompute activations in the backward pass: Megatron "
                                "--recompute-granularity selective (or full with --recompute-method "
                                "uniform); elsewhere torch.utils.checkpoint.checkpoint around each block",
    "optimizer_sharding": "shard the optimizer state over the data-parallel ranks: Megatron "
                          "--use-distributed-optimizer, DeepSpeed ZeRO stage 1, or FSDP (fully_shard)",
    "gradient_sharding": "shard the gradients too: DeepSpeed ZeRO stage 2, or FSDP (fully_shard)",
    "fragmentation": "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so the allocator grows segments "
                     "instead of caching blocks it cannot reuse",
    "retained_tensor": "free it after its last use: del it, or keep loss.item() / t.detach().cpu() instead "
                       "of the tensor (and its graph)",
}


class MemoryFinding(msgspec.Struct, frozen=True):
    """One change that would free memory.

    Attributes:
        kind: one of :data:`REMEDIES`' keys.
        bytes_freed: what it would free at the peak (``saving_bound`` says how it was bounded).
        summary: one sentence.
        remedy: the change to make.
        saving_bound: how ``bytes_freed`` was bounded.
        ranks: the ranks it applies to (the worst rank's bytes).
        evidence: JSON values (the category's bytes, the site, the ranks' figures).
    """

    kind: str
    bytes_freed: int
    summary: str
    remedy: str
    saving_bound: str
    ranks: list[int] = msgspec.field(default_factory=list)
    evidence: dict[str, Any] = msgspec.field(default_factory=dict)


_ACTION = {"smaller_micro_batch": "halving the micro-batch",
           "activation_recomputation": "recomputing them in the backward pass",
           "optimizer_sharding": "sharding it", "gradient_sharding": "sharding them"}


def _mib(n: float) -> str:
    return human_bytes(n)


def category_remedies(held: ByCategory, data_parallel: int,
                      fsdp2: bool = False) -> list[tuple[str, int, str]]:
    """``(kind, bytes freed, bound)`` of the remedies that act on ``held`` (bytes by category at the
    moment), over ``data_parallel`` ranks for the sharding ones (none under FSDP2, ``fsdp2``: its
    optimizer state and gradients are sharded already)."""
    shard = 1 - 1 / data_parallel if data_parallel > 1 and not fsdp2 else 0.0
    out = [
        ("smaller_micro_batch", held.activation // 2, "activations scale with the micro-batch: half of them"),
        ("activation_recomputation", held.activation,
         "at most the activations held (each recomputed block still keeps its input)"),
    ]
    if shard:
        out += [("optimizer_sharding", int(held.optimizer_state * shard),
                 f"1 - 1/{data_parallel} of the optimizer state over {data_parallel} data-parallel ranks"),
                ("gradient_sharding", int(held.gradient * shard),
                 f"1 - 1/{data_parallel} of the gradients over {data_parallel} data-parallel ranks")]
    return out


def findings_of(device: DeviceMemory, rank: int | None, data_parallel: int,
                fsdp2: bool = False) -> list[MemoryFinding]:
    """The findings of one rank's breakdown, largest saving first (below :data:`MIN_FINDING_BYTES`:
    none; no sharding ones on an FSDP2 job, ``fsdp2``)."""
    ranks = [rank] if rank is not None else []
    held = device.by_category
    found = []
    for kind, freed, bound in category_remedies(held, data_parallel, fsdp2):
        what = {"smaller_micro_batch": "activations", "activation_recomputation": "activations",
                "optimizer_sharding": "optimizer state", "gradient_sharding": "gradients"}[kind]
        total = {"activations": held.activation, "optimizer state": held.optimizer_state,
                 "gradients": held.gradient}[what]
        found.append(MemoryFinding(
            kind, freed, f"{what} {'holds' if what == 'optimizer state' else 'hold'} {_mib(total)} at the "
                         f"peak ({device.peak.phase} phase, "
                         f"{device.device}); {_ACTION[kind]} frees {_mib(freed)}", REMEDIES[kind], bound,
            ranks,
            {"category_bytes": total, "peak_bytes": device.peak_bytes, "phase": device.peak.phase}))
    if device.peak_reserved_bytes is not None and device.peak_reserved_bytes > device.peak_bytes:
        waste = device.peak_reserved_bytes - device.peak_bytes
        found.append(MemoryFinding(
            "fragmentation", waste, f"the allocator reserved {_mib(device.peak_reserved_bytes)} for a peak "
            f"of {_mib(device.peak_bytes)} allocated: {_mib(waste)} cached but unused",
            REMEDIES["fragmentation"],
            "the reserved memory above the peak allocated (what expandable segments can hand out)", ranks,
            {"peak_reserved_bytes": device.peak_reserved_bytes, "peak_allocated_bytes": device.peak_bytes}))
    for kept in device.retained:
        found.append(MemoryFinding(
            "retained_tensor", kept.bytes, f"{_mib(kept.per_step_bytes)} allocated at {kept.site} in each of "
            f"{kept.steps} steps is never freed: the earlier steps' hold {_mib(kept.bytes)}, more every step",
            REMEDIES["retained_tensor"], "what the earlier steps' allocations hold now (it grows every step)",
            ranks, {"site": kept.site, "per_step_bytes": kept.per_step_bytes, "steps": kept.steps,
                    "category": kept.category}))
    found = [f for f in found if f.bytes_freed >= MIN_FINDING_BYTES]
    return sorted(found, key=lambda f: (-f.bytes_freed, f.kind))
