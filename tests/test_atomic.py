"""Atomic publication: a file appears whole under its final name, or not at all."""

from __future__ import annotations

import os
import stat

import pytest

from torchprof_args.atomic import atomic_output, partial_path, write_json_atomically, write_text_atomically


def test_written_whole_and_parents_created(tmp_path):
    target = tmp_path / "a" / "b" / "out.txt"
    write_text_atomically(target, "hello")
    assert target.read_text() == "hello"
    assert os.listdir(target.parent) == ["out.txt"]


def test_failure_leaves_nothing_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(target, "w") as handle:
        handle.write("half")
        assert partial_path(target).exists()
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_private_files_are_0600_and_refuse_planted_names(tmp_path):
    target = tmp_path / "answer.json"
    write_json_atomically(target, {"ok": True})
    write_json_atomically(tmp_path / "private.json", {"id": "x"}, private=True, indent=1)
    assert stat.S_IMODE(os.stat(tmp_path / "private.json").st_mode) == 0o600
    assert target.read_text() == '{"ok": true}\n'
    assert sorted(os.listdir(tmp_path)) == ["answer.json", "private.json"]
