"""Shared test helpers: repository paths, the test data and a real ``torchrun`` launcher."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


#: Real traces the tests read (see data/README.md): the repository needs nothing beside it.
DATA = REPO / "tests" / "data"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_torchrun(script: str | Path, *args: str, nproc: int = 2, timeout: float = 300,
                 cwd: str | Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``nproc`` real ranks (gloo on CPU); returns the finished process."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=subprocess_env(**env), cwd=cwd)


def rank_results(result_dir: str | Path) -> dict[int, dict]:
    """The ``rank<R>.json`` files the test jobs write (per-rank files: torchrun interleaves stdout)."""
    import json

    return {entry["rank"]: entry for entry in
            (json.loads(path.read_text()) for path in sorted(Path(result_dir).glob("rank*.json")))}


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


class LogRecords(logging.Handler):
    """Collects the records of the ``torchprof_args`` loggers (which do not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def logs():
    logger = logging.getLogger("torchprof_args")
    handler = LogRecords()
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
