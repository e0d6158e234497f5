"""Child processes for the tests: free ports, the environment they run in, a real ``torchrun``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from helpers.paths import REPO


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout and ``tests/`` (for :mod:`helpers`) on ``PYTHONPATH``."""
    env = dict(os.environ)
    paths = (str(REPO), str(REPO / "tests"), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def torchrun_command(script: str | Path, *args: str, nproc: int = 2) -> list[str]:
    """The ``torchrun`` command line that runs ``script`` on ``nproc`` local ranks."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), *args]


def run_torchrun(script: str | Path, *args: str, nproc: int = 2, timeout: float = 300,
                 cwd: str | Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``nproc`` real ranks (gloo on CPU); returns the finished process.

    Unless ``TMPDIR`` is given, the job gets a temp directory of its own, removed afterwards:
    torchrun leaves its ``torchelastic_*`` log directory there, and killed ranks their scratch."""
    with tempfile.TemporaryDirectory(prefix="torchrun-") as scratch:
        return subprocess.run(torchrun_command(script, *args, nproc=nproc), capture_output=True, text=True,
                              timeout=timeout, env=subprocess_env(**{"TMPDIR": scratch, **env}), cwd=cwd)


def start_torchrun(script: str | Path, *args: str, nproc: int = 2, cwd: str | Path | None = None,
                   **env: str) -> subprocess.Popen[str]:
    """Start ``script`` on ``nproc`` real ranks in its own session (so that a test can SIGTERM the
    launcher, and kill the whole group if it does not end); output goes to files in ``cwd``, and
    (unless ``TMPDIR`` is given) the job's temp files too, so nothing is left outside the test's folder."""
    folder = Path(cwd or ".")
    scratch = folder / "tmp"
    scratch.mkdir(exist_ok=True)
    with open(folder / "torchrun.out", "w") as out, open(folder / "torchrun.err", "w") as err:
        return subprocess.Popen(torchrun_command(script, *args, nproc=nproc), stdout=out, stderr=err,
                                text=True, env=subprocess_env(**{"TMPDIR": str(scratch), **env}), cwd=cwd,
                                start_new_session=True)


def rank_results(result_dir: str | Path) -> dict[int, dict]:
    """The ``rank<R>.json`` files the test jobs write (per-rank files: torchrun interleaves stdout)."""
    return {entry["rank"]: entry for entry in
            (json.loads(path.read_text()) for path in sorted(Path(result_dir).glob("rank*.json")))}


def children(pid: int) -> list[int]:
    """The direct children of process ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def kill_job(launcher: subprocess.Popen[str]) -> None:
    """SIGKILL a job started by :func:`start_torchrun` as a node failure would: every rank (torchrun
    starts each in a session of its own) with what it forked, then the launcher."""
    import signal

    for rank in children(launcher.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()


def wait_until(condition: Callable[[], object], seconds: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``seconds`` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
