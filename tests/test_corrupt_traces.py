"""A corrupt trace (invalid UTF-8, truncated JSON, bad or truncated gzip) is one line on stderr naming
the file, exit status 2, in every ``torchprof`` command that reads traces (in process: fast)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from torchprof_args.console import main

GOOD_EVENT = b'{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1, "cat": "cpu_op"}'
_GZ = gzip.compress(b'{"traceEvents": [' + b", ".join([GOOD_EVENT] * 200) + b"]}")

#: name -> (content, a word of the expected reason)
CORRUPT = {
    # what torch 2.6's Python tracer wrote with with_stack: a name cut in the middle of a character
    "bad_utf8.json": (b'{"traceEvents": [' + GOOD_EVENT + b', {"name": "py\xff\xfe\x80", "ph": "X"}]}',
                      "UTF-8"),
    "truncated.json": (b'{"traceEvents": [' + GOOD_EVENT + b', {"name": "b", "ph"', "truncated"),
    "not_gzip.json.gz": (b"\x1f\x8b\x08\x00garbage that is no deflate stream", "gzip"),
    "truncated.json.gz": (_GZ[: len(_GZ) // 2], "gzip"),
}

#: command -> argv before the input files (outputs into tmp_path)
COMMANDS = {
    "summary": lambda out: ["summary"],
    "report": lambda out: ["report", "-o", str(out / "r.html")],
    "diff": lambda out: ["diff"],
    "split": lambda out: ["split", "--max-mb", "1", "-o", str(out / "parts")],
    "merge": lambda out: ["merge", "-o", str(out / "m.json")],
    "collectives": lambda out: ["collectives"],
    "diagnose": lambda out: ["diagnose", "--no-progress"],
    "mem": lambda out: ["mem", "--no-progress"],
    "critical-path": lambda out: ["critical-path", "--no-progress"],
    "brief": lambda out: ["brief", "--no-progress"],
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_corrupt_trace_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   command: str, name: str) -> None:
    content, reason = CORRUPT[name]
    bad = tmp_path / name
    bad.write_bytes(content)
    argv = COMMANDS[command](tmp_path) + [str(bad)] * (2 if command == "diff" else 1)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"torchprof {command}: error: {bad}: ") and reason in err, err


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_file_is_not_a_memory_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               name: str) -> None:
    bad = tmp_path / name.replace(".json", ".pickle")
    bad.write_bytes(CORRUPT[name][0])
    assert main(["mem", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"torchprof mem: error: {bad}: "), err


def test_corrupt_trace_in_a_run_folder_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "rank0_iter3.json"
    bad.write_bytes(CORRUPT["bad_utf8.json"][0])
    assert main(["summary", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: not valid UTF-8" in err, err
