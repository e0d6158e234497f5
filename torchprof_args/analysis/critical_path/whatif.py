"""What-if questions on the cycle's graph: parsed from text (:func:`parse_what_if`), answered by a
replay (:func:`predict`).

The questions ``torchprof critical-path --what-if`` takes (case does not matter):

* ``no CAUSE`` / ``without CAUSE``: a cause of :mod:`.variants` removed on every rank (``data
  loader``, ``host sync``, ``launch gaps``, ``gpu idle``, ``copies``, or a diagnose kind's name);
* ``communication fully overlapped``: nothing waits for communication (``no exposed_comm``);
* ``rank R like the median`` (``ranks 3,5 like the median``, ``all ranks like the median``): the
  ranks' time between collectives no longer than the median rank's;
* ``experts balanced`` (``balanced experts``, ``no expert_imbalance``): every rank's expert work (the
  stretches into an MoE combine) scaled to the ranks' mean, the heavy ranks' down and the light
  ranks' up (an MoE router balanced: the work moves, it is not removed);
* ``PATTERN Nx faster``: operators and kernels whose name matches the regular expression ``N``
  times faster.  From the sidecars this shortens the matching contributors kept for each stretch of
  a rank's path (its top 8): exact for what is on the path, an upper bound on the saving where a
  shortened stretch would let another path bind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgspec

from torchprof_args.analysis.critical_path.cycle import A, CycleGraph, Scenario, T, mean_into, median_into
from torchprof_args.analysis.critical_path.propagate import NONE
from torchprof_args.analysis.critical_path.reduced import Into
from torchprof_args.analysis.critical_path.variants import CAUSES

__all__ = ["ALIASES", "BALANCED", "WhatIf", "parse_what_if", "predict", "scenario"]

#: what a question may call a cause.
ALIASES = {
    "data loader": "dataloader_stall", "dataloader": "dataloader_stall", "loader": "dataloader_stall",
    "host sync": "host_sync", "host synchronisation": "host_sync", "host synchronization": "host_sync",
    "launch gaps": "launch_bound", "launch overhead": "launch_bound", "gpu idle": "gpu_idle",
    "copies": "memcpy", "exposed communication": "exposed_comm",
}
_FORMS = ("'no data loader' (or host sync, launch gaps, gpu idle, copies, a diagnose kind), "
          "'communication fully overlapped', 'rank 3 like the median', 'all ranks like the median', "
          "'experts balanced', 'PATTERN 2x faster'")
#: the questions that balance an MoE router (:func:`~.cycle.mean_into`).
BALANCED = ("experts balanced", "balanced experts", "expert load balanced", "no expert_imbalance",
            "without expert_imbalance", "no expert imbalance", "without expert imbalance")


@dataclass(frozen=True)
class WhatIf:
    """One question: remove a cause (``cause``), ranks like the median (``ranks``; empty: all),
    every rank's work at the ranks' mean (``balanced``), or names matching ``pattern`` ``factor``
    times faster."""

    spec: str
    cause: str | None = None
    median: bool = False
    balanced: bool = False
    ranks: tuple[int, ...] = ()
    pattern: re.Pattern[str] | None = field(default=None, compare=False)
    factor: float = 1.0


def parse_what_if(spec: str) -> WhatIf:
    """The question ``spec`` asks.

    Raises:
        ValueError: one line naming the forms understood.
    """
    text = " ".join(spec.strip().split())
    low = text.lower()
    if re.fullmatch(r"communication (fully )?overlapped", low):
        return WhatIf(text, cause="exposed_comm")
    if low in BALANCED:
        return WhatIf(text, balanced=True)
    found = re.fullmatch(r"(?:no|without) (.+)", low)
    if found:
        cause = ALIASES.get(found.group(1), found.group(1).replace(" ", "_"))
        if cause in CAUSES:
            return WhatIf(text, cause=cause)
    found = re.fullmatch(r"(all ranks|ranks? ([\d, ]+)) like the median", low)
    if found:
        listed = found.group(2)
        ranks = () if listed is None else tuple(int(r) for r in re.split(r"[ ,]+", listed) if r)
        return WhatIf(text, median=True, ranks=ranks)
    found = re.fullmatch(r"(.+) ([\d.]+)x faster", text, flags=re.IGNORECASE)
    if found:
        try:
            pattern, factor = re.compile(found.group(1)), float(found.group(2))
        except (re.error, ValueError) as exc:
            raise ValueError(f"what-if {spec!r}: {exc}") from None
        if factor > 0:
            return WhatIf(text, pattern=pattern, factor=factor)
    raise ValueError(f"what-if {spec!r} is not understood; ask one of: {_FORMS}")


def _faster(graph: CycleGraph, what: WhatIf) -> dict[tuple[int, str, int], Into]:
    """Each sink's path shortened by what its matching contributors save."""
    assert what.pattern is not None
    out: dict[tuple[int, str, int], Into] = {}
    base = Scenario()
    for v, kind in enumerate(graph.kind):
        if kind not in (A, T):
            continue
        part = graph.parts[graph.rank[v]]
        piece = part.pieces[graph.index[v]] if kind == A else part.step_pieces[graph.index[v]]
        into = graph.into(v, base)
        if piece is None or into is None or into.label1 == NONE:
            continue
        matched = sum(c.us for c in piece.top if what.pattern.search(c.name))
        if matched > 0:
            cut = matched * (1.0 - 1.0 / what.factor)
            shorter = msgspec.structs.replace(into, d1=max(into.d1 - cut, 0.0))
            out[(graph.rank[v], kind, graph.index[v])] = shorter
    return out


def scenario(graph: CycleGraph, what: WhatIf) -> Scenario:
    """The replay that answers ``what``."""
    if what.cause is not None:
        return Scenario(tables={rank: what.cause for rank in graph.ranks})
    if what.median:
        return Scenario(into=median_into(graph, list(what.ranks) or graph.ranks))
    if what.balanced:
        return Scenario(into=mean_into(graph))
    return Scenario(into=_faster(graph, what))


def predict(graph: CycleGraph, what: WhatIf) -> tuple[float | None, float | None]:
    """(the job's step in ms, what it saves per step) when ``what`` holds."""
    measured = graph.step_ms(graph.replay())
    predicted = graph.step_ms(graph.replay(scenario(graph, what)))
    if measured is None or predicted is None:
        return predicted, None
    return predicted, max(measured - predicted, 0.0)
