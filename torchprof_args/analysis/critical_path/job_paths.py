"""``torchprof critical-path``'s document for one cycle: :func:`critical_path` joins the ranks'
reduced graphs (:mod:`.cycle`), reads each step's path off the measured replay (:mod:`.path`) and
answers the what-ifs asked (:mod:`.whatif`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from torchprof_args.analysis.critical_path.cycle import clocks_of_paths, cycle_graph
from torchprof_args.analysis.critical_path.path import (
    PATH_VERSION,
    CriticalPathDoc,
    WhatIfAnswer,
    step_paths,
    top_entries,
)
from torchprof_args.analysis.critical_path.reduced import RankPaths
from torchprof_args.analysis.critical_path.whatif import WhatIf, predict

__all__ = ["critical_path"]


def _how(what: WhatIf) -> str:
    if what.cause is not None:
        return f"each rank's graph replayed without {what.cause}, then the ranks joined"
    if what.median:
        return "the ranks' time between collectives cut to the median rank's"
    if what.balanced:
        return "every rank's expert work scaled to the ranks' mean (moved, not removed)"
    return "the matching operators and kernels on each stretch of the path shortened (from the sidecars)"


def critical_path(parts: Sequence[RankPaths], path: str, cycle: str | None = None,
                  questions: Sequence[WhatIf] = (),
                  rank_of: Callable[[RankPaths, int], int] | None = None,
                  align_clocks: bool = True) -> CriticalPathDoc:
    """One cycle's critical path per step, and the what-ifs' answers.

    Args:
        parts: each rank's reduced graph (from its sidecar, or its parsed trace).
        path: the path given (for the document).
        cycle: which cycle (``iterations A-B``).
        questions: what-ifs to answer.
        rank_of: the rank of a part (default: its own, else its position).
        align_clocks: whether the hosts' clocks are aligned (False: estimated and said, not applied).

    Returns:
        The :class:`~.path.CriticalPathDoc`.
    """
    graph = cycle_graph(parts, rank_of, clocks_of_paths(parts, rank_of, apply=align_clocks))
    measured = graph.replay()
    top: dict[tuple[int, str, str, str | None], float] = defaultdict(float)
    notes = list(graph.notes)
    steps = step_paths(graph, measured, top, notes)
    answers = []
    for what in questions:
        step, saving = predict(graph, what)
        answers.append(WhatIfAnswer(what.spec, None if step is None else round(step, 3),
                                    None if saving is None else round(saving, 3), _how(what)))
    step_ms = graph.step_ms(measured)
    notes = list(dict.fromkeys(notes))
    return CriticalPathDoc(version=PATH_VERSION, path=path, cycle=cycle, ranks=len(graph.parts),
                           step_ms=None if step_ms is None else round(step_ms, 3), steps=steps,
                           top=top_entries(top, len(steps)), what_if=answers, notes=notes, clock=graph.clock)
