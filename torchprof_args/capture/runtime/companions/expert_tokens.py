"""Each MoE layer's routed tokens per expert over the recorded windows: torchtitan's count, kept.

torchtitan's MoE layer (``torchtitan/models/common/moe.py``) adds, in every training forward, the
tokens its router sent to each global expert (this rank's tokens) to its ``tokens_per_expert_E``
buffer; the optimizer's pre-hook zeroes it only with load balancing on (``load_balance_coeff``), and
nothing logs it.  :class:`ExpertTokenCounter` finds every module with such a buffer (duck-typed),
and while a window records on this rank takes, around each of their forwards, the buffer's growth
(a forward pre-hook copies the buffer on its device, the post-hook adds the difference to the step's
row: no host sync, no collective), whether or not the optimizer zeroes it between steps.  Each
recorded step's rows stay on the device; the window's flush (:class:`~..recorder.Recorder`) copies
them to the host once and stages the rank's file (:mod:`torchprof_args.shared.expert_tokens_file`),
which the publisher puts in the cycle folder's ``expert_tokens/``.

Activation checkpointing recomputes a layer's forward in the backward pass, and torchtitan's buffer
counts those tokens again (its optimizer halves the buffer under full recomputation).  The hooks
skip a forward that runs inside the backward (autograd's current graph task: a recomputation,
reentrant or not), so each training forward counts once, whatever the checkpointing.  Under
torch.compile (torchtitan compiles each block with ``fullgraph=True``) the hooks trace into the graph
without a break; dynamo guards on the flag ``active``, so the first window's start recompiles each
block once (both variants then stay cached; ``TORCH_LOGS=recompiles`` shows it).  Forwards outside
training mode add nothing (torchtitan counts only in training).  The buffer is float32: its counts are
exact up to 2**24 tokens per expert, so without load balancing (never zeroed) a long run's deltas are
as exact as torchtitan's own count, no more.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchprof_args.atomic import write_json_atomically
from torchprof_args.log import get_logger
from torchprof_args.naming import EXPERT_TOKENS_SUFFIX
from torchprof_args.shared.expert_tokens_file import make_document

__all__ = ["BUFFER", "TORCHTITAN_SOURCE", "ExpertTokenCounter", "moe_layers"]

logger = get_logger(__name__)

#: the buffer torchtitan's MoE layers count their routed tokens in.
BUFFER = "tokens_per_expert_E"
#: the ``source`` of the files written from it.
TORCHTITAN_SOURCE = "torchtitan MoE tokens_per_expert_E"


def moe_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules of ``model`` with a :data:`BUFFER` tensor of one dimension, by qualified name."""
    found = []
    for name, module in model.named_modules():
        buffer = module._buffers.get(BUFFER)  # noqa: SLF001 - a buffer of this module, not a submodule's
        if isinstance(buffer, torch.Tensor) and buffer.dim() == 1:
            found.append((name, module))
    return found


def _counts(module: nn.Module) -> torch.Tensor:
    """The layer's :data:`BUFFER` (a DTensor's local shard: torchtitan's is replicated), detached."""
    tensor = module._buffers[BUFFER]  # noqa: SLF001 - this module's own buffer
    assert tensor is not None
    to_local = getattr(tensor, "to_local", None)
    local: torch.Tensor = to_local() if callable(to_local) else tensor
    return local.detach()


def _in_backward() -> bool:
    """Whether autograd's engine runs this code (an activation-checkpointing recomputation); never
    inside a graph torch.compile traces (the hooks run in its forward, and a compiled recomputation
    replays no Python side effect: torchtitan sets ``skip_fwd_side_effects_in_bwd_under_checkpoint``)."""
    if torch.compiler.is_compiling():
        return False
    current = getattr(torch._C, "_current_graph_task_id", None)  # noqa: SLF001
    return current is not None and current() != -1


class ExpertTokenCounter:
    """The routed tokens per expert of the MoE layers of the models watched, per recorded step.

    Args:
        rank: this rank (the file's ``rank``).
    """

    def __init__(self, *, rank: int) -> None:
        self.rank = rank
        self.layers: list[str] = []
        self.experts = 0
        self.ep_ranks: list[int] | None = None
        self._modules: dict[int, int] = {}  # id(module) -> its layer's index
        self._handles: list[Any] = []
        self._before: dict[int, torch.Tensor] = {}
        self._row: list[torch.Tensor | None] = []
        self._steps: list[tuple[int, list[torch.Tensor | None]]] = []
        self.active = False

    def watch(self, model: nn.Module, ep_ranks: list[int] | None = None) -> int:
        """Hook every MoE layer of ``model`` (:func:`moe_layers`); returns how many.

        Args:
            model: the model (or one pipeline stage of it).
            ep_ranks: the global ranks of this rank's expert-parallel group, in its order (expert
                ``e`` lives on ``ep_ranks[e // (experts / len(ep_ranks))]``); None: not known.

        Raises:
            ValueError: layers of different expert counts, or ``ep_ranks`` that do not divide them.
        """
        found = [(name, module) for name, module in moe_layers(model) if id(module) not in self._modules]
        for name, module in found:
            experts = int(_counts(module).numel())
            if self.experts and experts != self.experts:
                raise ValueError(f"MoE layer {name} has {experts} experts, {self.layers[0]} {self.experts}")
            self.experts = experts
        if ep_ranks is not None:
            if not ep_ranks or (self.experts and self.experts % len(ep_ranks)):
                raise ValueError(f"ep_ranks {ep_ranks} do not divide {self.experts} experts")
            self.ep_ranks = [int(r) for r in ep_ranks]
        for name, module in found:
            self._modules[id(module)] = len(self.layers)
            self.layers.append(name)
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post))
        self._row = [None] * len(self.layers)
        return len(found)

    def remove(self) -> None:
        """Take the hooks off (the models keep working unwatched)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- the hooks: one clone and one subtraction per forward, on the buffer's device ------------

    def _pre(self, module: nn.Module, args: Any) -> None:
        if self.active and not _in_backward():
            with torch.no_grad():
                self._before[id(module)] = _counts(module).clone()

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        before = self._before.pop(id(module), None)
        if before is None:
            return
        with torch.no_grad():
            grown = _counts(module) - before
            index = self._modules[id(module)]
            row = self._row[index]
            self._row[index] = grown if row is None else row + grown

    # -- the window: driven by the recorder ------------------------------------------------------

    def start(self) -> None:
        """A window starts recording: count from the next forward."""
        self.active = True
        self._steps.clear()
        self._before.clear()
        self._row = [None] * len(self.layers)

    def end_step(self, iteration: int) -> None:
        """Recorded step ``iteration`` ended: its rows are kept (on the device)."""
        if not self.active:
            return
        self._steps.append((iteration, self._row))
        self._row = [None] * len(self.layers)

    def finish(self, staging: Path) -> Path | None:
        """The window was flushed: stop counting, copy its steps to the host (once) and stage the
        rank's file in ``staging``; returns it (None without MoE layers or steps, or on an error,
        logged with the rank: profiling never stops training)."""
        steps = self._stop()
        if not steps or not self.layers:
            return None
        try:
            counts = self._to_host(steps)
            iterations = [iteration for iteration, _ in steps]
            doc = make_document(rank=self.rank, source=TORCHTITAN_SOURCE, iterations=iterations,
                                layers=list(self.layers), experts=self.experts, ep_ranks=self.ep_ranks,
                                counts=counts)
            name = f"rank{self.rank:05d}_pid{os.getpid()}_iter{iterations[0]:06d}{EXPERT_TOKENS_SUFFIX}"
            path = staging / name
            write_json_atomically(path, doc)
            return path
        except Exception as err:  # noqa: BLE001 - profiling must never stop training
            logger.error("rank %d: could not write the tokens per expert: %s: %s", self.rank,
                         type(err).__name__, err)
            return None

    def discard(self) -> None:
        """The window was dropped: stop counting, forget its steps."""
        self._stop()

    def _stop(self) -> list[tuple[int, list[torch.Tensor | None]]]:
        steps, self._steps = self._steps, []
        self.active = False
        self._before.clear()
        self._row = [None] * len(self.layers)
        return steps

    def _to_host(self, steps: list[tuple[int, list[torch.Tensor | None]]]) -> list[list[list[float]]]:
        """Every step's rows in one copy to the host (a layer that ran no forward: zeros)."""
        rows = [row for _, layers in steps for row in layers if row is not None]
        if not rows:
            return [[[0.0] * self.experts for _ in self.layers] for _ in steps]
        zero = torch.zeros_like(rows[0])
        stacked = torch.stack([torch.stack([zero if row is None else row.to(zero.dtype) for row in layers])
                               for _, layers in steps])
        values: list[list[list[float]]] = stacked.float().cpu().tolist()
        return values
