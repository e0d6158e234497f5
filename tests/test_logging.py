"""torchprof's log lines go into the host application's logging, each with the rank; the package
prints them itself only while the application has configured no handler."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from helpers.processes import subprocess_env

HOST = textwrap.dedent("""
    import logging, sys
    from torchprof_args.log import get_logger
    logger = get_logger(__name__)          # created before the host configures logging
    if sys.argv[1] != "none":
        logging.basicConfig(filename=sys.argv[1], level=logging.INFO,
                            format="HOST %(levelname)s %(name)s | %(message)s")
    logger.info("published %d traces", 2)
    get_logger("torchprof_args.capture.runtime.fence").warning("rank %d was late", 1)
""")


def run_host(log_file: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HOST, log_file], capture_output=True, text=True,
                          timeout=120, env=subprocess_env(RANK="3", **env))


def test_host_that_logs_to_a_file_gets_every_line_with_the_rank(tmp_path: Path) -> None:
    log_file = tmp_path / "train.log"
    result = run_host(str(log_file))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # the host owns the lines: nothing printed twice
    lines = log_file.read_text().splitlines()
    assert lines == ["HOST INFO torchprof_args.__main__ | [torchprof rank 3] published 2 traces",
                     "HOST WARNING torchprof_args.capture.runtime.fence | [torchprof rank 3] rank 1 was late"]


def test_without_host_logging_the_package_prints_each_line_once() -> None:
    result = run_host("none")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("INFO torchprof_args.__main__: [torchprof rank 3] published 2 traces")
    assert lines[1].endswith(
        "WARNING torchprof_args.capture.runtime.fence: [torchprof rank 3] rank 1 was late")


def test_log_level_variable_sets_the_package_verbosity(tmp_path: Path) -> None:
    log_file = tmp_path / "train.log"
    result = run_host(str(log_file), TORCHPROF_LOG_LEVEL="WARNING")
    assert result.returncode == 0, result.stderr
    assert log_file.read_text().splitlines() == [
        "HOST WARNING torchprof_args.capture.runtime.fence | [torchprof rank 3] rank 1 was late"]
