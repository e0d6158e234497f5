"""The parallel layout a Hugging Face ``Trainer`` knows, for each trace's ``torchprof_args`` metadata:
DDP, FSDP or DeepSpeed (ZeRO stage) under Accelerate, the world size, gradient accumulation, the
per-device batch, and Accelerate's ``ParallelismConfig`` sizes when one is set.  Reads only the
``TrainingArguments`` and Accelerate's process state: no collective."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["trainer_layout"]


def trainer_layout(args: Any, rank: int) -> dict[str, Any]:
    """``{"parallel": {"dp": rank}, "trainer": {...}}``: this rank's data-parallel coordinate (what
    ``torchprof summary`` shows per rank) and the Trainer's settings (JSON values only)."""
    world_size = int(getattr(args, "world_size", 1) or 1)
    layout: dict[str, Any] = {
        "framework": _framework(),
        "strategy": _strategy(args, world_size),
        "distributed_type": _distributed_type(),
        "world_size": world_size,
        "gradient_accumulation_steps": int(getattr(args, "gradient_accumulation_steps", 1) or 1),
        "per_device_train_batch_size": int(getattr(args, "per_device_train_batch_size", 1) or 1),
    }
    sizes = _parallelism_sizes(getattr(args, "parallelism_config", None))
    if sizes:
        layout["parallelism_config"] = sizes
    return {"parallel": {"dp": rank}, "trainer": layout}


def _framework() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def _strategy(args: Any, world_size: int) -> str:
    deepspeed = getattr(args, "deepspeed", None)
    if deepspeed:
        stage = _zero_stage(deepspeed)
        return f"DeepSpeed ZeRO-{stage}" if stage is not None else "DeepSpeed"
    fsdp = getattr(args, "fsdp", None)
    if fsdp:
        options = fsdp if isinstance(fsdp, str) else " ".join(str(getattr(o, "value", o)) for o in fsdp)
        return f"FSDP ({options})" if options.strip() else "FSDP"
    return "DDP" if world_size > 1 else "single process"


def _zero_stage(deepspeed: Any) -> int | None:
    config = deepspeed
    if isinstance(deepspeed, str):
        try:
            with open(deepspeed) as handle:
                config = json.load(handle)
        except (OSError, ValueError):
            return None
    stage = (config.get("zero_optimization") or {}).get("stage") if isinstance(config, dict) else None
    return stage if isinstance(stage, int) else None


def _distributed_type() -> str | None:
    try:
        from accelerate.state import PartialState

        state = PartialState()
        return str(getattr(state.distributed_type, "value", state.distributed_type))
    except Exception:  # noqa: BLE001 - no Accelerate state: the layout says less
        return None


def _parallelism_sizes(config: Any) -> dict[str, int]:
    if config is None:
        return {}
    names = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
    return {name: int(value) for name in names if isinstance(value := getattr(config, name, None), int)}
