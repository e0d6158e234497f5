"""The expert-tokens file: one rank's routed tokens per expert, per MoE layer, in each recorded step
of one window, in one place for both sides.

The job (:mod:`torchprof_args.capture.runtime.companions.expert_tokens`: torchtitan's MoE layers'
``tokens_per_expert_E``, taken around each forward) writes it with the window's trace, in the cycle
folder's ``expert_tokens/`` (``<cycle>/expert_tokens/<stem>.expert_tokens.json``); ``torchprof
diagnose`` (:mod:`torchprof_args.analysis.diagnose.expert_tokens`) reads it.  One JSON object::

    {"format": "torchprof-expert-tokens", "version": 1, "rank": 0,
     "source": "torchtitan MoE tokens_per_expert_E", "iterations": [3, 4],
     "layers": ["layers.1.moe", "layers.3.moe"], "experts": 8,
     "ep_ranks": [0, 1, 2, 3] | null,
     "counts": [[[tokens this rank routed to each global expert] per layer] per iteration]}

``counts[i][l][e]``: the tokens of THIS rank (its batch, every micro-batch of the step) that layer
``layers[l]``'s router sent to expert ``e`` (a global expert id; a top-k router counts a token k
times) in iteration ``iterations[i]``.  ``ep_ranks``: the global ranks of this rank's expert-parallel
group in its order (expert ``e`` lives on ``ep_ranks[e // (experts / len(ep_ranks))]``); null: not
known (every expert counted on the rank that routed to it).  Import-light (standard library only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypedDict, cast

from torchprof_args.shared import formats

__all__ = ["ExpertTokensDoc", "load_expert_tokens", "make_document"]

#: Files larger than this are not expert-tokens files (thousands of layers x experts x steps still fit).
_MAX_BYTES = 64 << 20


class ExpertTokensDoc(TypedDict):
    """The file's fields (see the module)."""

    format: str
    version: int
    rank: int
    source: str
    iterations: list[int]
    layers: list[str]
    experts: int
    ep_ranks: list[int] | None
    counts: list[list[list[float]]]


def make_document(*, rank: int, source: str, iterations: list[int], layers: list[str], experts: int,
                  ep_ranks: list[int] | None, counts: list[list[list[float]]]) -> ExpertTokensDoc:
    """The file's object, of this version."""
    return ExpertTokensDoc(format=formats.EXPERT_TOKENS.name, version=formats.EXPERT_TOKENS.version,
                           rank=rank, source=source, iterations=iterations, layers=layers, experts=experts,
                           ep_ranks=ep_ranks, counts=counts)


def load_expert_tokens(path: str | os.PathLike[str]) -> ExpertTokensDoc:
    """Read and check one expert-tokens file; raises ValueError with one line naming the file."""
    path = Path(path)
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise ValueError(f"{path}: larger than {_MAX_BYTES >> 20} MiB, not an expert-tokens file")
        payload: Any = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    name, version = formats.EXPERT_TOKENS.name, formats.EXPERT_TOKENS.version
    if not isinstance(payload, dict) or payload.get("format") != name:
        raise ValueError(f"{path}: not a torchprof expert-tokens file (no \"format\": \"{name}\")")
    if payload.get("version") != version:
        raise ValueError(f"{path}: expert-tokens format version {payload.get('version')!r}; this "
                         f"torchprof-args reads version {version}: use the job's torchprof-args")
    problem = _problem(payload)
    if problem:
        raise ValueError(f"{path}: a damaged expert-tokens file ({problem})")
    return cast(ExpertTokensDoc, payload)


def _problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with a document of this version's fields, else None."""
    iterations, layers, experts = doc.get("iterations"), doc.get("layers"), doc.get("experts")
    counts, ep_ranks = doc.get("counts"), doc.get("ep_ranks")
    if not isinstance(doc.get("rank"), int) or not isinstance(experts, int) or experts < 1:
        return "no rank or expert count"
    if not isinstance(iterations, list) or not all(isinstance(i, int) for i in iterations):
        return "iterations are not integers"
    if not isinstance(layers, list) or not all(isinstance(name, str) for name in layers):
        return "layers are not names"
    if ep_ranks is not None and (not isinstance(ep_ranks, list) or not ep_ranks
                                 or not all(isinstance(r, int) for r in ep_ranks) or experts % len(ep_ranks)):
        return f"ep_ranks {ep_ranks!r} do not divide {experts} experts"
    if not isinstance(counts, list) or len(counts) != len(iterations):
        return "not one row of counts per iteration"
    for step in counts:
        if not isinstance(step, list) or len(step) != len(layers):
            return "not one row of counts per layer"
        for row in step:
            if (not isinstance(row, list) or len(row) != experts
                    or not all(isinstance(v, int | float) and v >= 0 for v in row)):
                return f"a layer's row is not {experts} counts"
    return None
