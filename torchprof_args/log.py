"""Rank-aware logging: every line says which rank wrote it."""

from __future__ import annotations

import logging
import os

_FORMAT = "%(asctime)s [torchprof rank %(rank)s] %(levelname)s %(name)s: %(message)s"


def current_rank() -> int:
    """The global rank: the process group's when initialised, else ``$RANK``, else 0."""
    try:
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except (RuntimeError, ValueError):
        pass
    rank = os.environ.get("RANK", "0")
    return int(rank) if rank.isdigit() else 0


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = current_rank()
        return True


def get_logger(name: str) -> logging.Logger:
    """A ``torchprof_args`` logger whose lines carry the rank.

    A handler is attached once to the package's root logger unless the application configured
    its own; set ``TORCHPROF_LOG_LEVEL`` (e.g. DEBUG) to change verbosity.
    """
    root = logging.getLogger("torchprof_args")
    if not getattr(root, "_torchprof_configured", False):
        root._torchprof_configured = True  # type: ignore[attr-defined]
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.addFilter(_RankFilter())
        root.addHandler(handler)
        root.setLevel(os.environ.get("TORCHPROF_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return logging.getLogger(name if name.startswith("torchprof_args") else f"torchprof_args.{name}")
