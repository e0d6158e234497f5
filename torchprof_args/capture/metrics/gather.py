"""Every rank's readings in one fixed-size tensor all-gather per log interval.

``all_gather_object`` pickles, and is two collectives (sizes, then the bytes) plus a host/device
copy each way.  The timers and the metrics writer instead agree **once** on a layout (which timer
name and which per-rank figure sits in which slot, with an object all-gather) and from then on
send one float64 tensor per interval: ``[request fingerprint, agreement id, values...]``.

Every rank's tensor has the same length (the largest layout agreed so far), so a rank that asks
for something new cannot make the collective mismatch: its header says so, every rank sees every
header, and every rank takes the same branch (agree anew, then gather again).  In the steady
state an interval costs one collective of ``ranks x (2 + slots) x 8`` bytes.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

from torchprof_args import _dist
from torchprof_args.errors import TimerNamesMismatchError

__all__ = ["Agreement", "RankGather", "Request", "describe_mismatch"]

#: Slots before the values: this rank's request fingerprint, the id of the agreement it used.
HEADER = 2
#: Agreements each rank remembers (by its own request fingerprint).
MAX_AGREEMENTS = 32


@dataclasses.dataclass(frozen=True)
class Request:
    """What one rank asks to gather: timer ``names`` (explicit, the same on every rank, or this
    rank's own list when ``union``) and the keys of its per-rank ``figures``."""

    names: tuple[str, ...]
    union: bool
    figures: tuple[str, ...] = ()

    def fingerprint(self) -> int:
        text = "\x1e".join(("u" if self.union else "e", "\x1f".join(self.names), "\x1f".join(self.figures)))
        return zlib.crc32(text.encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class Agreement:
    """A layout every rank agreed on: timer ``names`` then ``figures`` keys, in slot order.

    ``global_ranks[r]`` is group rank ``r``'s global rank; ``coordinates[r]`` its megatron-core
    parallel coordinates (None when megatron-core's parallel state was not up on that rank).
    """

    id: int
    names: tuple[str, ...]
    figures: tuple[str, ...]
    global_ranks: tuple[int, ...]
    coordinates: tuple[Mapping[str, int] | None, ...]


def describe_mismatch(names_by_rank: Sequence[Sequence[str]]) -> str:
    """Which ranks ask for which other names than rank 0 (at most four ranks named)."""
    reference = list(names_by_rank[0])
    problems: list[str] = []
    for rank, names in enumerate(names_by_rank[1:], start=1):
        names = list(names)
        if names == reference:
            continue
        missing = [n for n in reference if n not in names]
        extra = [n for n in names if n not in reference]
        if missing or extra:
            parts = [f"lacks {missing}"] if missing else []
            parts += [f"has extra {extra}"] if extra else []
            problems.append(f"rank {rank} {' and '.join(parts)} compared with rank 0")
        else:
            problems.append(f"rank {rank} lists the same names in a different order ({names})")
        if len(problems) >= 4:
            problems.append("...")
            break
    return "; ".join(problems)


def _ordered_union(lists: Sequence[Sequence[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for names in lists for name in names))


def _megatron_coordinates() -> dict[str, int] | None:
    """This rank's parallel coordinates when megatron-core's parallel state is up (never imports it)."""
    state = sys.modules.get("megatron.core.parallel_state")
    try:
        if state is None or not state.model_parallel_is_initialized():
            return None
        from torchprof_args.capture.runtime.ranks import parallel_coordinates

        return parallel_coordinates()
    except Exception:  # noqa: BLE001 - coordinates are a nicety in a log line
        return None


class RankGather:
    """The per-interval gather over ``group`` (every rank of the group must call :meth:`gather`)."""

    def __init__(self, group: ProcessGroup | None = None) -> None:
        self.group = group
        self._capacity = 0
        self._next_id = 0
        self._mine: OrderedDict[int, Agreement] = OrderedDict()
        self._single: dict[Request, Agreement] = {}  # one process: nothing to agree on
        #: Collectives issued so far (the benchmark and the tests read it).
        self.collectives = 0

    def gather(self, request: Request, times: Mapping[str, float],
               figures: Mapping[str, float]) -> tuple[Agreement, list[list[float]]]:
        """``(agreement, rows)``: ``rows[r]`` is group rank ``r``'s values in the agreement's slot
        order (NaN where that rank has no value).  Raises :class:`TimerNamesMismatchError` on every
        rank when explicit timer names differ across ranks."""
        dist = _dist.dist_if_initialized()
        world = dist.get_world_size(self.group) if dist is not None else 1
        if dist is None or world == 1:
            coordinates = _megatron_coordinates()
            agreement = self._single.get(request)
            if agreement is None or agreement.coordinates[0] != coordinates:
                agreement = Agreement(0, request.names, request.figures, (_dist.rank(),), (coordinates,))
                if len(self._single) < MAX_AGREEMENTS:
                    self._single[request] = agreement
            return agreement, [self._values(agreement, times, figures)]
        fingerprint = request.fingerprint()
        if self._next_id:
            known = self._mine.get(fingerprint)
            rows = self._all_gather(dist, self._pack(fingerprint, known, times, figures))
            ids = {row[1] for row in rows}
            if len(ids) == 1 and known is not None and rows[0][1] == known.id:
                self._mine.move_to_end(fingerprint)
                return known, [row[HEADER : HEADER + self._width(known)] for row in rows]
        agreement = self._agree(dist, request, fingerprint)
        rows = self._all_gather(dist, self._pack(fingerprint, agreement, times, figures))
        return agreement, [row[HEADER : HEADER + self._width(agreement)] for row in rows]

    @staticmethod
    def _width(agreement: Agreement) -> int:
        return len(agreement.names) + len(agreement.figures)

    @staticmethod
    def _values(
        agreement: Agreement, times: Mapping[str, float], figures: Mapping[str, float]
    ) -> list[float]:
        return ([float(times.get(name, math.nan)) for name in agreement.names]
                + [float(figures.get(key, math.nan)) for key in agreement.figures])

    def _pack(self, fingerprint: int, agreement: Agreement | None, times: Mapping[str, float],
              figures: Mapping[str, float]) -> list[float]:
        row = [float(fingerprint), float(agreement.id if agreement is not None else -1)]
        values = self._values(agreement, times, figures) if agreement is not None else []
        return row + values + [math.nan] * (self._capacity - len(values))

    def _agree(self, dist: ModuleType, request: Request, fingerprint: int) -> Agreement:
        """One object all-gather: every rank's request; the agreed layout (or the mismatch error)."""
        mine = (request.names, request.union, request.figures, _dist.rank(), _megatron_coordinates())
        world = dist.get_world_size(self.group)
        gathered: list[Any] = [None] * world  # each rank's ``mine``, unpickled
        dist.all_gather_object(gathered, mine, group=self.group)
        self.collectives += 2  # all_gather_object: sizes, then the pickles
        names_by_rank = [list(item[0]) for item in gathered]
        if any(item[1] for item in gathered):
            if not all(item[1] for item in gathered):
                raise TimerNamesMismatchError(
                    "Timers.log/write must be called with the same timer names on every rank: some ranks "
                    "passed names=None (every timer) and others an explicit list. Pass one form on all "
                    "ranks.")
            names = _ordered_union(names_by_rank)
        elif any(n != names_by_rank[0] for n in names_by_rank):
            raise TimerNamesMismatchError(
                "Timers.log/write must be called with the same timer names on every rank: "
                f"{describe_mismatch(names_by_rank)}. Pass one list of names on all ranks "
                "(or names=None to log the union of all timers).")
        else:
            names = tuple(names_by_rank[0])
        agreement = Agreement(self._next_id, names, _ordered_union([item[2] for item in gathered]),
                              tuple(item[3] for item in gathered), tuple(item[4] for item in gathered))
        self._next_id += 1
        self._capacity = max(self._capacity, self._width(agreement))
        self._mine[fingerprint] = agreement
        self._mine.move_to_end(fingerprint)
        while len(self._mine) > MAX_AGREEMENTS:
            self._mine.popitem(last=False)
        return agreement

    def _all_gather(self, dist: ModuleType, row: list[float]) -> list[list[float]]:
        """One fixed-size float64 all-gather on the group's device."""
        import torch

        device = _collective_device(dist, self.group)
        world = dist.get_world_size(self.group)
        local = torch.tensor(row, dtype=torch.float64, device=device)
        out = torch.empty(world * len(row), dtype=torch.float64, device=device)
        # all_gather_single is the newer name of all_gather_into_tensor (deprecated since).
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        all_gather(out, local, group=self.group)
        self.collectives += 1
        return out.view(world, len(row)).cpu().tolist()


def _collective_device(dist: ModuleType, group: ProcessGroup | None) -> torch.device:
    """The device ``all_gather_object`` would use on ``group`` (CPU for gloo, the current GPU for NCCL)."""
    import torch

    try:
        from torch.distributed.distributed_c10d import _get_object_coll_device

        kind = _get_object_coll_device(group)
    except (ImportError, RuntimeError, ValueError):
        kind = "cpu" if "gloo" in str(dist.get_backend(group)) else "cuda"
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)
