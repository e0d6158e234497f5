"""Rank-aware logging: every line says which rank wrote it."""

from __future__ import annotations

import logging
import os

from torchprof_args import _dist

_FORMAT = "%(asctime)s [torchprof rank %(rank)s] %(levelname)s %(name)s: %(message)s"


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = _dist.rank()
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
