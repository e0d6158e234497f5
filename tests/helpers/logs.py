"""Collecting the package's log records in a test."""

from __future__ import annotations

import logging


class LogRecords(logging.Handler):
    """Collects the records of the ``torchprof_args`` loggers."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        """The messages logged at ``level``."""
        return [r.getMessage() for r in self.records if r.levelno == level]
