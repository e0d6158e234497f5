"""Run the README's worked examples verbatim (``<!-- example: NAME -->`` + a bash block)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO
from helpers.processes import free_port, subprocess_env


def readme_example(name: str) -> str:
    """The bash block that follows ``<!-- example: name -->`` in README.md."""
    text = (REPO / "README.md").read_text()
    match = re.search(rf"<!-- example: {re.escape(name)} -->\s*```bash\n(.*?)```", text, re.S)
    assert match, f"README.md has no example {name!r}"
    return match.group(1)


def run_readme_example(name: str, workdir: Path, *, pythonpath: list[Path] = (), timeout: float = 300,
                       **env: str) -> subprocess.CompletedProcess[str]:
    """Run the example in ``workdir`` (with the repo's integrations/, configs/ and tests/ linked in;
    ``torchprof`` runs this checkout's code, whatever the environment's console script points at)."""
    for entry in ("integrations", "configs", "tests"):
        link = workdir / entry
        if not link.exists():
            link.symlink_to(REPO / entry)
    bindir = str(Path(sys.executable).parent)
    environment = subprocess_env(MASTER_PORT=str(free_port()), **env)
    environment["PATH"] = os.pathsep.join([bindir, environment.get("PATH", "")])
    environment["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), environment["PYTHONPATH"]])
    script = 'set -euo pipefail\ntorchprof() { python -m torchprof_args "$@"; }\n' + readme_example(name)
    return subprocess.run(["bash", "-c", script], cwd=workdir, env=environment, capture_output=True,
                          text=True, timeout=timeout)
