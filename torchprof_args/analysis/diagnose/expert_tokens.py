"""Tokens per expert as the framework logged them, beside a cycle's traces: what ``expert_imbalance``
says per expert (the traces give only each rank's tokens, from the all-to-alls' sizes).

Megatron-LM (core_v0.19.0 on), with ``--save-tokens-per-expert-interval N``, writes every N-th
iteration each rank's ``<--save>/tokens_per_expert/rank<R>.jsonl``: one line per MoE layer,
``{"iter": I, "block": "decoder", "layer": L, "tpe": [[tokens of each local expert] per
micro-batch]}`` (MTP layers: ``"block": "mtp"``), the token counts its MoE layers' grouped expert
linear received (``megatron/training/activation_logging.py``).  A rank's figure per local expert is
the sum over its layers and micro-batches, the mean over the iterations logged: those of the cycle
when it logged any (``traced``), else all.  The folder is found beside the traces (the cycle folder,
the profile folder, the run folder above it), or given.

torchtitan keeps its count in each MoE layer's ``tokens_per_expert_E`` buffer (the router's, for the
aux-loss-free bias update) and logs none of it.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchprof_args.analysis.beside import read_beside, traced_cycle

__all__ = ["MEGATRON_TPE", "TPE_FOLDER", "ExpertTokens", "expert_tokens_beside",
           "megatron_expert_tokens"]

#: the folder Megatron-LM writes its tokens-per-expert files into.
TPE_FOLDER = "tokens_per_expert"
#: the source those files are named by.
MEGATRON_TPE = "Megatron-LM's --save-tokens-per-expert-interval (tokens_per_expert/rank<R>.jsonl)"
_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


@dataclass(frozen=True)
class ExpertTokens:
    """Each rank's experts' tokens per iteration, as the framework logged them.

    Attributes:
        source: who logged them (:data:`MEGATRON_TPE`).
        path: the folder read.
        per_rank: rank -> tokens per iteration of each of its local experts (summed over its MoE
            layers and micro-batches).
        iterations: the iterations averaged.
        traced: whether those are the cycle's (else every iteration logged).
    """

    source: str
    path: str
    per_rank: dict[int, list[float]]
    iterations: list[int]
    traced: bool

    def per_expert(self) -> dict[tuple[int, int], float]:
        """(rank, local expert) -> tokens per iteration."""
        return {(r, e): v for r, row in sorted(self.per_rank.items()) for e, v in enumerate(row)}

    @property
    def imbalance_factor(self) -> float:
        """The busiest expert's tokens over the experts' mean (0 when none got any)."""
        values = list(self.per_expert().values())
        mean = statistics.fmean(values) if values else 0.0
        return max(values) / mean if mean > 0 else 0.0

    @property
    def hottest(self) -> tuple[int, int]:
        """(rank, local expert) of the busiest expert."""
        found = self.per_expert()
        return max(found, key=found.__getitem__)


def _tpe_in(folder: Path) -> Path | None:
    """``folder``'s :data:`TPE_FOLDER` where it holds ``rank<R>.jsonl`` files."""
    candidate = folder / TPE_FOLDER
    has_ranks = candidate.is_dir() and any(_RANK_FILE.match(p.name) for p in candidate.iterdir())
    return candidate if has_ranks else None


def megatron_expert_tokens(folder: Path, traces: Sequence[Path] = ()) -> ExpertTokens | None:
    """Megatron-LM's tokens per expert in ``folder`` (see the module), over the iterations of the
    cycle ``traces`` belong to where it logged any.

    Args:
        folder: a :data:`TPE_FOLDER`.
        traces: the cycle's traces (their folder's name says its iterations).

    Returns:
        The :class:`ExpertTokens`; None without a line.

    Raises:
        ValueError: a line that is not Megatron-LM's (its text in the message).
    """
    by_rank: dict[int, dict[int, list[float]]] = {}
    for path in sorted(folder.iterdir()):
        match = _RANK_FILE.match(path.name)
        if not match:
            continue
        per_iter: dict[int, list[float]] = defaultdict(list)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                iteration, batches = int(record["iter"]), record["tpe"]
                row = per_iter[iteration]
                for batch in batches:
                    row.extend([0.0] * (len(batch) - len(row)))
                    for e, tokens in enumerate(batch):
                        row[e] += float(tokens)
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{number}: not Megatron-LM's tokens per expert ({err}): "
                                 f"{line[:120]}") from None
        if per_iter:
            by_rank[int(match.group(1))] = dict(per_iter)
    if not by_rank:
        return None
    cycle = traced_cycle(traces)
    logged = sorted({i for rows in by_rank.values() for i in rows})
    in_cycle = [i for i in logged if cycle is not None and cycle[0] <= i <= cycle[1]]
    chosen = in_cycle or logged
    per_rank = {}
    for rank, rows in sorted(by_rank.items()):
        kept = [rows[i] for i in chosen if i in rows]
        if kept:
            width = max(len(r) for r in kept)
            per_rank[rank] = [sum(r[e] for r in kept if e < len(r)) / len(kept) for e in range(width)]
    return ExpertTokens(MEGATRON_TPE, str(folder), per_rank, chosen, bool(in_cycle))


def expert_tokens_beside(traces: Sequence[Path], within: Sequence[str] | None = None) -> ExpertTokens | None:
    """The framework's tokens per expert beside ``traces`` (a :data:`TPE_FOLDER` holding
    ``rank<R>.jsonl`` files: :func:`~.beside.find_beside`), None where there are none or they
    cannot be read."""
    return read_beside(traces, within, _tpe_in, megatron_expert_tokens)
