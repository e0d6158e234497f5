"""Fixtures shared by the tests; helper functions live in the ``helpers`` package beside this file."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
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
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # wandb's wandb-artifacts / wandb-media scratch
    monkeypatch.setattr(tempfile, "tempdir", None)
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


@pytest.fixture(scope="session", autouse=True)
def suite_tmpdir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The suite's own temp directory (``TMPDIR`` for the tests and every job they start), under
    pytest's basetemp: what a test leaves outside its ``tmp_path`` shows up here, not among other
    users' files in /tmp, and fails the session (``pytest_sessionfinish``) when it does."""
    directory = tmp_path_factory.getbasetemp() / "TMPDIR"
    directory.mkdir(exist_ok=True)
    # torch's compile cache would otherwise go into TMPDIR (it is a cache, not a leftover)
    caches = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "torchinductor")}
    saved = {name: os.environ.get(name) for name in ("TMPDIR", *caches)}
    os.environ.update({"TMPDIR": str(directory), **caches})
    tempfile.tempdir = None
    yield directory
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None
    held = _held_until_exit()
    left = sorted(str(p.relative_to(directory)) for p in directory.iterdir() if p.name not in held)
    request.config.stash[LEFT_IN_TMPDIR] = (directory, left)


def _held_until_exit() -> set[str]:
    """Temp directories this process still holds, that their owner removes when it exits: torch
    (up to 2.9 at least) makes one at import time of ``torch.distributed.nn.jit.instantiator``
    (which ``torch.distributed.fsdp`` imports), a ``tempfile.TemporaryDirectory`` removed at exit."""
    module = sys.modules.get("torch.distributed.nn.jit.instantiator")
    held = getattr(module, "_TEMP_DIR", None)
    return {Path(held.name).name} if isinstance(held, tempfile.TemporaryDirectory) else set()


LEFT_IN_TMPDIR = pytest.StashKey[tuple[Path, list[str]]]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when tests left files in the suite's temp directory (see ``suite_tmpdir``)."""
    directory, left = session.config.stash.get(LEFT_IN_TMPDIR, (None, []))
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"tests left {len(left)} entries in the temp directory {directory} (use "
                                f"tmp_path, or remove them): {', '.join(left[:20])}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
