"""Fixtures shared by the tests; helper functions live in the ``helpers`` package beside this file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.logs import LogRecords


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real wandb in offline mode: nothing touches the network or the real home directory."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("NETRC", raising=False)


@pytest.fixture
def logs():
    """The ``torchprof_args`` log records of the test (a :class:`helpers.logs.LogRecords`)."""
    logger = logging.getLogger("torchprof_args")
    handler = LogRecords()
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
