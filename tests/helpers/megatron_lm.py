"""Megatron-LM source trees for the integration tests, and how to run their code on CPU ranks.

A tree is a Megatron-LM checkout (``megatron/training``, ``pretrain_gpt.py`` ...): ``$MEGATRON_LM_PATH``
(one checkout, or a folder of ``<tag>/`` checkouts), else ``../shared/megatron-lm/<tag>`` beside
the repository checkout.  Without one, the tests that need it skip with that reason; a fresh
clone still passes.  Every CPU workaround lives in ``megatron_cpu/sitecustomize.py``, put first
on ``PYTHONPATH`` of the Megatron-LM processes; :data:`CPU_FLAGS` are the Megatron-LM flags a
CPU-only, gloo run needs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers.paths import REPO

#: The Megatron-LM releases tested: the last with ``pretrain(..., extra_args_provider=...)``
#: generation and one with ``pretrain(cfg_container, ...)``.
TAGS = ("core_v0.16.1", "core_v0.19.0")

#: Folder with the CPU workarounds (a ``sitecustomize`` module).
CPU_HELPER = REPO / "tests" / "megatron_cpu"

#: Megatron-LM flags for CPU ranks with gloo (no Transformer Engine, apex or fused CUDA kernels).
CPU_FLAGS = ("--transformer-impl local --no-persist-layer-norm --no-gradient-accumulation-fusion "
             "--clip-grad 0 --distributed-backend gloo --num-workers 0")


def _is_tree(path: Path) -> bool:
    return (path / "megatron" / "training" / "training.py").is_file() and (path / "pretrain_gpt.py").is_file()


def megatron_lm_trees() -> list[tuple[str, Path]]:
    """``(name, tree)`` for every Megatron-LM checkout found (see the module docstring)."""
    configured = os.environ.get("MEGATRON_LM_PATH")
    if configured:
        root = Path(configured).expanduser().resolve()
        if _is_tree(root):
            return [(root.name, root)]
        return ([(child.name, child) for child in sorted(root.iterdir()) if _is_tree(child)]
                if root.is_dir() else [])
    shared = REPO.parent / "shared" / "megatron-lm"
    return [(tag, shared / tag) for tag in TAGS if _is_tree(shared / tag)]


def tree_params() -> list:
    """pytest params, one per tree; a single skipped param (with the reason) when there is none."""
    trees = megatron_lm_trees()
    if trees:
        return [pytest.param(tree, id=name) for name, tree in trees]
    configured = os.environ.get("MEGATRON_LM_PATH")
    if configured:
        reason = (f"MEGATRON_LM_PATH={configured} holds no Megatron-LM checkout "
                  "(megatron/training/training.py and pretrain_gpt.py), nor folders of them")
    else:
        reason = ("no Megatron-LM source: set MEGATRON_LM_PATH to a checkout (or a folder of them), or put "
                  f"checkouts at {REPO.parent / 'shared' / 'megatron-lm'}/<tag> for tags {', '.join(TAGS)}")
    return [pytest.param(None, id="no-megatron-lm", marks=pytest.mark.skip(reason=reason))]


def takes_config_container(tree: Path) -> bool:
    """Read from the tree's source: ``pretrain(cfg_container, ...)`` (core_v0.18.0 on) or the older shape."""
    source = (tree / "megatron" / "training" / "training.py").read_text()
    signature = re.search(r"^def pretrain\((.*?)\):", source, re.S | re.M)
    return signature is not None and "extra_args_provider" not in signature.group(1)


def pythonpath(tree: Path) -> list[Path]:
    """``PYTHONPATH`` entries for a Megatron-LM process on CPU: the workarounds, then the tree
    (its own ``megatron/core`` before any installed megatron-core)."""
    return [CPU_HELPER, tree]
