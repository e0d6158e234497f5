"""One error path for every ``torchprof`` command: a path that does not exist, or an input that is
not what the command reads, is one line ``torchprof COMMAND: error: ...`` on stderr and exit status
2 (``CommandError``, printed by ``console.main`` alone), never a traceback.  In process: fast.

Corrupt traces (every trace command) and memory snapshots: tests/test_corrupt_traces.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.paths import REPO
from helpers.processes import subprocess_env

from torchprof_args.commands.docs_reference import _subcommands
from torchprof_args.console import EXIT_STATUSES, build_parser, main
from torchprof_args.errors import CommandError, ExitStatus, TraceError

#: command -> argv naming a path that does not exist (``missing``), outputs into ``out``.
MISSING: dict[str, Callable[[Path, Path], list[str]]] = {
    "summary": lambda missing, out: ["summary", str(missing)],
    "report": lambda missing, out: ["report", str(missing), "-o", str(out / "r.html")],
    "diff": lambda missing, out: ["diff", str(missing), str(missing)],
    "split": lambda missing, out: ["split", str(missing), "--max-mb", "1"],
    "merge": lambda missing, out: ["merge", str(missing), "-o", str(out / "m.json")],
    "mem": lambda missing, out: ["mem", str(missing)],
    "collectives": lambda missing, out: ["collectives", str(missing)],
    "hang": lambda missing, out: ["hang", str(missing)],
    "diagnose": lambda missing, out: ["diagnose", str(missing)],
    "critical-path": lambda missing, out: ["critical-path", str(missing)],
    "brief": lambda missing, out: ["brief", str(missing)],
    "pyspy report": lambda missing, out: ["pyspy", "report", str(missing)],
    "pyspy speedscope": lambda missing, out: ["pyspy", "speedscope", str(missing), "-o", str(out / "f.json")],
    "dashboard": lambda missing, out: ["dashboard", str(missing)],
    "trigger": lambda missing, out: ["trigger", "--job-dir", str(missing)],
    "trigger --stacks": lambda missing, out: ["trigger", "--stacks", "--job-dir", str(missing)],
    "goodput": lambda missing, out: ["goodput", str(missing)],
    "trend": lambda missing, out: ["trend", str(missing), str(missing)],
    "mcp": lambda missing, out: ["mcp", "--root", str(missing)],
}
#: Commands that read no input path: ``flags`` prints (or writes) the reference, ``nsys`` a command line.
NO_INPUT_PATH = {"flags", "nsys"}


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"torchprof {command}: error: "), err
    assert "Traceback" not in err
    return err


def test_every_command_is_covered() -> None:
    """A new command joins :data:`MISSING` (or says it reads no path)."""
    commands = {name for name, _ in _subcommands(build_parser())}
    covered = {name.split()[0] for name in MISSING}
    assert commands == covered | NO_INPUT_PATH


@pytest.mark.parametrize("name", sorted(MISSING))
def test_a_path_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    missing = tmp_path / "does-not-exist"
    assert main(MISSING[name](missing, tmp_path)) == ExitStatus.CANNOT_RUN
    err = _one_error_line(capsys, name.split()[0])
    assert str(missing) in err


def _malformed(tmp_path: Path, name: str) -> list[str]:
    """Write an input that is not what the command reads; returns its argv."""
    if name == "hang":
        (tmp_path / "flight_recorder").mkdir()
        (tmp_path / "flight_recorder" / "gloo_trace_rank_0").write_bytes(b"not a pickle")
        return ["hang", str(tmp_path)]
    if name.startswith("pyspy"):
        (tmp_path / "raw.txt").write_bytes(b"\x00\x01 this is no py-spy output\n")
        tail = ["-o", str(tmp_path / "f.json")] if name == "pyspy speedscope" else []
        return [*name.split(), str(tmp_path / "raw.txt"), *tail]
    if name == "dashboard":
        (tmp_path / "metrics.jsonl").write_text("{not json\n")
        return ["dashboard", str(tmp_path)]
    folder = tmp_path / ("stacks" if name == "trigger --stacks" else "ondemand")
    folder.mkdir(mode=0o700)
    (folder / "job.json").write_text("{truncated")
    return [*name.split(), "--job-dir", str(tmp_path)]


@pytest.mark.parametrize("name", ["hang", "pyspy report", "pyspy speedscope", "dashboard", "trigger",
                                  "trigger --stacks"])
def test_a_malformed_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """The trace commands and ``mem``: tests/test_corrupt_traces.py."""
    assert main(_malformed(tmp_path, name)) == ExitStatus.CANNOT_RUN
    _one_error_line(capsys, name.split()[0])


def test_usage_errors_of_the_commands_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Errors the commands find in their arguments exit 2, like argparse's own."""
    cases = {
        "summary": ["summary", str(tmp_path), "--shard", "0/2"],
        "split": ["split", str(tmp_path), "--max-mb", "0"],
        "nsys": ["nsys"],
        "pyspy": ["pyspy", "record"],
        "trigger": ["trigger", "--native", "--job-dir", str(tmp_path)],
        "dashboard": ["dashboard"],
    }
    for command, argv in cases.items():
        assert main(argv) == ExitStatus.CANNOT_RUN, argv
        _one_error_line(capsys, command)
    with pytest.raises(SystemExit) as usage:
        main(["summary"])  # argparse: a required argument missing
    assert usage.value.code == ExitStatus.CANNOT_RUN
    capsys.readouterr()


def test_the_convention_is_the_console_help() -> None:
    """The statuses the console's help (and docs/reference/commands.md) lists are ExitStatus's."""
    listed = {int(line.split()[0]) for line in EXIT_STATUSES.splitlines()[1:] if line.split()[0].isdigit()}
    assert listed == {int(status) for status in ExitStatus}
    assert build_parser().epilog == EXIT_STATUSES


def test_command_error_keeps_its_status_across_processes() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(CommandError("the job stopped", ExitStatus.PARTLY_FAILED)))
    assert (str(err), err.status) == ("the job stopped", 1)
    trace = pickle.loads(pickle.dumps(TraceError("t.json: truncated")))
    assert isinstance(trace, CommandError) and trace.status == ExitStatus.CANNOT_RUN


def test_commands_leave_the_exit_to_the_console() -> None:
    """No command module prints its own errors or exits: no sys.exit / SystemExit, no stderr
    ``error:`` lines (only ``python -m`` mains, under ``if __name__ == "__main__"``)."""
    for path in sorted((REPO / "torchprof_args" / "commands").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        main_blocks = [node for node in tree.body
                       if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
        inside_main = {id(n) for block in main_blocks for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in inside_main:
                continue
            text = ast.unparse(node) if isinstance(node, ast.Call | ast.Raise) else ""
            assert "sys.exit" not in text and "SystemExit" not in text, f"{path.name}: {text}"
            assert not (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and ": error: " in node.value), f"{path.name} prints its own error line"


@pytest.mark.slow  # a process of its own (about 0.5 s)
def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``torchprof flags --markdown | head -0``: no traceback, exit 0, once for every command."""
    proc = subprocess.Popen([sys.executable, "-m", "torchprof_args", "flags", "--markdown"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the first write
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b"", err.decode()
