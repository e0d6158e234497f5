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
aux-loss-free bias update) and logs none of it; the profiler records it (``TorchProfiler.watch_experts``,
which the torchtitan integration calls) in each traced window: one file per traced rank in the cycle
folder's ``expert_tokens/`` (:mod:`torchprof_args.shared.expert_tokens_file`), the tokens THAT rank
routed to each global expert, per layer and step.  An expert's tokens are what it received: the sum
over the ranks of its expert-parallel group (``ep_ranks``, the traced ones) of what they routed to
it, expert ``e`` living on ``ep_ranks[e // experts_per_rank]`` as its local expert
``e % experts_per_rank`` (without ``ep_ranks`` every rank holds every expert: its own counts); per
iteration, summed over the layers, the mean over the cycle's iterations (``traced``), else all.

One search finds either (:func:`~.beside.find_beside`, nearest folder first; the torchtitan files
first where one folder holds both); a file of another version or a damaged one is refused in one
line naming it: beside the traces ``diagnose`` says it on stderr and goes on without, through
``--expert-tokens`` it is the command's error.
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
from torchprof_args.naming import EXPERT_TOKENS_SUBDIR, EXPERT_TOKENS_SUFFIX
from torchprof_args.shared.expert_tokens_file import load_expert_tokens

__all__ = ["MEGATRON_TPE", "TORCHTITAN_TOKENS", "TPE_FOLDER", "ExpertTokens", "expert_tokens_beside",
           "expert_tokens_folder", "megatron_expert_tokens", "read_expert_tokens", "recorded_expert_tokens"]

#: the folder Megatron-LM writes its tokens-per-expert files into.
TPE_FOLDER = "tokens_per_expert"
#: the source those files are named by.
MEGATRON_TPE = "Megatron-LM's --save-tokens-per-expert-interval (tokens_per_expert/rank<R>.jsonl)"
#: the source of the files the profiler records (torchtitan's MoE layers' counts).
TORCHTITAN_TOKENS = ("torchtitan's MoE tokens_per_expert_E, recorded in the traced windows "
                     f"({EXPERT_TOKENS_SUBDIR}/<stem>{EXPERT_TOKENS_SUFFIX})")
_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


@dataclass(frozen=True)
class ExpertTokens:
    """Each rank's experts' tokens per iteration, as the framework logged them.

    Attributes:
        source: who logged them (:data:`MEGATRON_TPE`, :data:`TORCHTITAN_TOKENS`).
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


def _recorded(folder: Path) -> bool:
    """Whether ``folder`` holds files the profiler recorded (``*.expert_tokens.json``)."""
    return folder.is_dir() and any(p.name.endswith(EXPERT_TOKENS_SUFFIX) for p in folder.iterdir())


def _megatron(folder: Path) -> bool:
    """Whether ``folder`` holds Megatron-LM's ``rank<R>.jsonl`` files."""
    return folder.is_dir() and any(_RANK_FILE.match(p.name) for p in folder.iterdir())


def expert_tokens_folder(folder: Path) -> Path | None:
    """``folder``'s tokens per expert: its ``expert_tokens/`` (recorded), else its :data:`TPE_FOLDER`
    (Megatron-LM's), where they hold such files."""
    recorded, megatron = folder / EXPERT_TOKENS_SUBDIR, folder / TPE_FOLDER
    return recorded if _recorded(recorded) else megatron if _megatron(megatron) else None


def read_expert_tokens(folder: Path, traces: Sequence[Path] = ()) -> ExpertTokens | None:
    """The tokens per expert in ``folder``, the profiler's files (:func:`recorded_expert_tokens`) or
    Megatron-LM's (:func:`megatron_expert_tokens`).

    Raises:
        ValueError: a file that cannot be read (one line naming it).
    """
    if _recorded(folder):
        return recorded_expert_tokens(folder, traces)
    return megatron_expert_tokens(folder, traces)


def recorded_expert_tokens(folder: Path, traces: Sequence[Path] = ()) -> ExpertTokens | None:
    """Each expert's received tokens from the routed counts the profiler recorded in ``folder`` (see
    the module), over the iterations of the cycle ``traces`` belong to where the files hold any.

    Raises:
        ValueError: a file of another version or a damaged one (one line naming it).
    """
    docs = [load_expert_tokens(p) for p in sorted(folder.iterdir()) if p.name.endswith(EXPERT_TOKENS_SUFFIX)]
    if not docs:
        return None
    cycle = traced_cycle(traces)
    logged = sorted({i for doc in docs for i in doc["iterations"]})
    in_cycle = [i for i in logged if cycle is not None and cycle[0] <= i <= cycle[1]]
    chosen = set(in_cycle or logged)
    received: dict[tuple[int, int], float] = defaultdict(float)
    for doc in docs:
        steps = [step for i, step in zip(doc["iterations"], doc["counts"], strict=True) if i in chosen]
        group = doc["ep_ranks"] or [doc["rank"]]
        per = doc["experts"] // len(group)
        for step in steps:
            for layer in step:
                for e, tokens in enumerate(layer):
                    received[(group[e // per], e % per)] += tokens / len(steps)
    per_rank: dict[int, list[float]] = {}
    for (rank, local), tokens in sorted(received.items()):
        row = per_rank.setdefault(rank, [])
        row.extend([0.0] * (local + 1 - len(row)))
        row[local] = tokens
    return ExpertTokens(TORCHTITAN_TOKENS, str(folder), per_rank, sorted(chosen), bool(in_cycle))


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


def expert_tokens_beside(traces: Sequence[Path], within: Sequence[str] | None = None,
                         problems: list[str] | None = None) -> ExpertTokens | None:
    """The framework's tokens per expert beside ``traces`` (:func:`expert_tokens_folder`, by
    :func:`~.beside.find_beside`), None where there are none or they cannot be read (why: one line
    appended to ``problems`` when given)."""
    return read_beside(traces, within, expert_tokens_folder, read_expert_tokens, problems)
