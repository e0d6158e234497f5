"""Which ranks trace: global rank numbers, or megatron-core parallel coordinates.

``--torch-profile-parallel-ranks dp=0 tp=0`` names ranks by their (dp, tp, pp, cp, ep)
coordinates; turning that into global ranks needs every rank's coordinates, so
:func:`traced_ranks` is a collective when selectors are given (one ``all_gather_object``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchprof_args import _dist
from torchprof_args.capture.runtime.config import PARALLEL_AXES, TraceConfig
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.log import get_logger

__all__ = ["parallel_coordinates", "resolve_parallel_ranks", "traced_ranks"]

logger = get_logger(__name__)


def parallel_coordinates() -> dict[str, int]:
    """This rank's (dp, tp, pp, cp, ep) coordinates.

    From megatron-core's ``parallel_state`` when it is initialised; otherwise every rank is a
    data-parallel replica (``dp`` = global rank, the other axes 0), as in plain DDP or DeepSpeed.
    """
    rank = _dist.rank() if _dist.dist_if_initialized() is not None else 0
    try:
        from megatron.core import parallel_state as ps
    except ImportError:
        ps = None
    if ps is None or not ps.model_parallel_is_initialized():
        return {"dp": rank, "tp": 0, "pp": 0, "cp": 0, "ep": 0}
    return {
        "dp": ps.get_data_parallel_rank(),
        "tp": ps.get_tensor_model_parallel_rank(),
        "pp": ps.get_pipeline_model_parallel_rank(),
        "cp": ps.get_context_parallel_rank(),
        "ep": ps.get_expert_model_parallel_rank(),
    }


def _all_coordinates() -> list[dict[str, int]]:
    """Every rank's coordinates, indexed by global rank (one all_gather_object)."""
    mine = parallel_coordinates()
    dist = _dist.dist_if_initialized()
    if dist is None or dist.get_world_size() == 1:
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


def _selector_text(selectors: Sequence[tuple[str, Sequence[int]]]) -> str:
    return " ".join(f"{axis}={','.join(map(str, indices))}" for axis, indices in selectors)


def resolve_parallel_ranks(selectors: Sequence[tuple[str, Sequence[int]]],
                           coordinates: Sequence[dict[str, int]]) -> list[int]:
    """Global ranks whose coordinates match every ``(axis, indices)`` selector.

    Raises :class:`TorchProfileArgsError` when an axis is given twice or nothing matches.
    """
    axes = [axis for axis, _ in selectors]
    repeated = sorted({axis for axis in axes if axes.count(axis) > 1})
    if repeated:
        raise TorchProfileArgsError(
            f"--torch-profile-parallel-ranks: axis {', '.join(repeated)} given more than once; list several "
            "indices in one token instead (e.g. dp=0,1).")
    chosen = [rank for rank, coords in enumerate(coordinates)
              if all(coords.get(axis, 0) in set(indices) for axis, indices in selectors)]
    if not chosen:
        sizes = ", ".join(f"{axis} 0..{max(c.get(axis, 0) for c in coordinates)}" for axis in PARALLEL_AXES)
        raise TorchProfileArgsError(f"--torch-profile-parallel-ranks {_selector_text(selectors)} selects "
                                    f"no rank (this job has {sizes}).")
    return chosen


def traced_ranks(trace: TraceConfig) -> tuple[int, ...] | None:
    """The global ranks ``trace`` selects (None: all).  Collective when parallel selectors are given."""
    if not trace.parallel_ranks:
        return trace.ranks
    ranks = resolve_parallel_ranks(trace.parallel_ranks, _all_coordinates())
    logger.info("--torch-profile-parallel-ranks %s: tracing global ranks %s",
                _selector_text(trace.parallel_ranks), ranks)
    return tuple(ranks)
