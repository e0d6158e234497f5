"""Run the documentation's worked examples verbatim: ``<!-- example: NAME -->`` followed by a bash
block, in README.md or any ``docs/**/*.md`` page (names are unique across them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO
from helpers.processes import free_port, subprocess_env

#: A marker (on a line of its own) and the bash block right after it.
EXAMPLE = re.compile(r"^<!-- example: ([\w.-]+) -->\s*```bash\n(.*?)```", re.S | re.M)
#: Any example marker on a line of its own, followed by a bash block or not.
MARKER = re.compile(r"^<!-- example: (\S*) -->", re.M)
#: A CI workflow shown in the docs (not run: a GitHub Actions YAML block), checked by the tests.
CI_WORKFLOW = re.compile(r"^<!-- ci: ([\w.-]+) -->\s*```yaml\n(.*?)```", re.S | re.M)


def doc_pages() -> list[Path]:
    """README.md and every markdown page of the documentation site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def doc_examples() -> dict[str, tuple[Path, str]]:
    """Every example: name -> (the page, its bash block).  A name used twice is an error."""
    found: dict[str, tuple[Path, str]] = {}
    for page in doc_pages():
        for match in EXAMPLE.finditer(page.read_text(encoding="utf-8")):
            name = match.group(1)
            assert name not in found, f"example {name!r} is in both {found[name][0]} and {page}"
            found[name] = (page, match.group(2))
    return found


def doc_example(name: str) -> str:
    """The bash block that follows ``<!-- example: name -->`` in README.md or docs/."""
    examples = doc_examples()
    assert name in examples, f"neither README.md nor docs/ has an example {name!r}"
    return examples[name][1]


def ci_workflow(name: str) -> str:
    """The YAML block that follows ``<!-- ci: name -->`` in README.md or docs/."""
    found = [m.group(2) for page in doc_pages()
             for m in CI_WORKFLOW.finditer(page.read_text(encoding="utf-8")) if m.group(1) == name]
    assert len(found) == 1, f"README.md and docs/ have {len(found)} CI workflows named {name!r}"
    return found[0]


def run_doc_example(name: str, workdir: Path, *, pythonpath: list[Path] = (), timeout: float = 300,
                    **env: str) -> subprocess.CompletedProcess[str]:
    """Run the example in ``workdir`` (with the repo's integrations/, configs/ and tests/ linked in;
    ``torchprof`` runs this checkout's code, whatever the environment's console script points at)."""
    for entry in ("integrations", "configs", "tests"):
        link = workdir / entry
        if not link.exists():
            link.symlink_to(REPO / entry)
    bindir = str(Path(sys.executable).parent)
    scratch = workdir / ".tmp"  # TMPDIR: torchrun's torchelastic_* logs stay in the test's directory
    scratch.mkdir(exist_ok=True)
    environment = subprocess_env(MASTER_PORT=str(free_port()), **{"TMPDIR": str(scratch), **env})
    environment["PATH"] = os.pathsep.join([bindir, environment.get("PATH", "")])
    environment["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), environment["PYTHONPATH"]])
    script = 'set -euo pipefail\ntorchprof() { python -m torchprof_args "$@"; }\n' + doc_example(name)
    return subprocess.run(["bash", "-c", script], cwd=workdir, env=environment, capture_output=True,
                          text=True, timeout=timeout)
