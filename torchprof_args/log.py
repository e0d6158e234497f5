"""Rank-aware logging that fits the host application's logging.

Every record of a ``torchprof_args`` logger carries the rank: as the ``rank`` attribute and as a
``[torchprof rank R]`` prefix of its message, so the line says which rank wrote it whatever
formatter prints it.  Records propagate to the application's handlers (Megatron-LM writing to a
file, a cluster's JSON logger); only while the application has configured no handler at all does
the package print them itself, on standard error.
"""

from __future__ import annotations

import logging
import os

from torchprof_args import _dist

ROOT_NAME = "torchprof_args"
LEVEL_VARIABLE = "TORCHPROF_LOG_LEVEL"
_FALLBACK_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _RankFilter(logging.Filter):
    """Stamps each record with the rank, once, before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            rank = record.__dict__["rank"] = _dist.rank()  # as logging's ``extra=`` would set it
            record.msg = f"[torchprof rank {rank}] {record.msg}"
        return True


class _FallbackHandler(logging.StreamHandler):
    """Prints to standard error only while neither the root logger nor any logger between it
    and the package has a handler: once the application configures logging, it owns the lines."""

    def emit(self, record: logging.LogRecord) -> None:
        if not _application_has_handlers():
            super().emit(record)


def _application_has_handlers() -> bool:
    logger = logging.getLogger(ROOT_NAME).parent
    while logger is not None:
        if logger.handlers:
            return True
        logger = logger.parent if logger.propagate else None
    return False


_RANK_FILTER = _RankFilter()


def _configure_package_logger() -> logging.Logger:
    root = logging.getLogger(ROOT_NAME)
    if not any(isinstance(h, _FallbackHandler) for h in root.handlers):
        handler = _FallbackHandler()
        handler.setFormatter(logging.Formatter(_FALLBACK_FORMAT))
        root.addHandler(handler)
        root.setLevel(os.environ.get(LEVEL_VARIABLE, "INFO").upper())
    return root


def get_logger(name: str) -> logging.Logger:
    """The ``torchprof_args`` logger ``name``, whose records carry the rank.

    Verbosity: ``TORCHPROF_LOG_LEVEL`` (e.g. DEBUG; INFO by default), or the application's own
    ``logging.getLogger("torchprof_args").setLevel(...)``.
    """
    _configure_package_logger()
    full_name = name if name.startswith(ROOT_NAME) else f"{ROOT_NAME}.{name}"
    logger = logging.getLogger(full_name)
    if _RANK_FILTER not in logger.filters:
        logger.addFilter(_RANK_FILTER)
    return logger
