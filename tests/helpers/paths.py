"""Where the repository and its test data are: the repository needs nothing beside it."""

from __future__ import annotations

from pathlib import Path

#: The repository checkout the tests run from.
REPO = Path(__file__).resolve().parents[2]

#: Real traces the tests read (see ``tests/data/README.md``).
DATA = REPO / "tests" / "data"

#: The scripts the tests launch on real ranks.
JOBS = REPO / "tests" / "jobs"
