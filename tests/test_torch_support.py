"""The supported torch range: each feature whose torch API is missing says so in one line naming the
feature and the release it needs; with_modules on releases where it does nothing in eager mode."""

from __future__ import annotations

import argparse
import logging
import pickle
import re
import sys
from pathlib import Path

import pytest
from helpers.paths import REPO

from torchprof_args import add_torch_profile_args, configs_from_args
from torchprof_args import torch_support as support
from torchprof_args.capture.runtime import flight_recorder
from torchprof_args.console import main as torchprof


def _pretend_torch(monkeypatch: pytest.MonkeyPatch, release: tuple[int, int]) -> None:
    monkeypatch.setattr(support, "installed_torch", lambda: release)


def test_install_requires_and_docs_table_state_the_range() -> None:
    setup = (REPO / "setup.py").read_text()
    low = ".".join(map(str, support.MIN_TORCH))
    assert f'"torch>={low}"' in setup
    doc = (REPO / "docs" / "getting-started.md").read_text()
    rows = dict(re.findall(r"^\| (.+?) \| (\d+\.\d+) \|$", doc, flags=re.M))
    assert rows == {feature: ".".join(map(str, release))
                    for feature, (release, _) in support.FEATURES.items()}
    assert "getting-started.md#supported-pytorch-versions" in (REPO / "README.md").read_text()


def test_needs_is_one_line_naming_feature_and_release(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_torch(monkeypatch, (2, 9))
    assert support.needs("torchprof hang") == (
        "torchprof hang needs torch >= 2.10 (torch.distributed.flight_recorder (PyTorch's analyzer) is "
        "missing in torch 2.9); upgrade torch to use it")
    assert not support.torch_at_least((2, 10)) and support.torch_at_least((2, 9))


def test_hang_without_pytorchs_analyzer_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    """torch 2.9 has the gloo dumps but not torch.distributed.flight_recorder (2.10)."""
    _pretend_torch(monkeypatch, (2, 9))
    for name in [n for n in sys.modules if n.startswith("torch.distributed.flight_recorder.")]:
        monkeypatch.delitem(sys.modules, name)  # imported by another test: forgotten until the end
    monkeypatch.setitem(sys.modules, "torch.distributed.flight_recorder", None)  # as on 2.9: no module
    dumps = tmp_path / "flight_recorder"
    dumps.mkdir()
    entry = {"process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0, "is_p2p": False}
    for rank in (0, 1):
        (dumps / f"gloo_trace_rank_{rank}").write_bytes(pickle.dumps(
            {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [entry]}))
    assert torchprof(["hang", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"torchprof hang: error: {support.needs('torchprof hang')}\n"


def test_hang_without_pytorchs_analyzer_still_says_where_each_rank_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """torch 2.9 with the stacks beside the dumps: the stacks answer, the analyzer's absence is a note."""
    from torchprof_args.capture.stacks.dumper import StackDumper

    _pretend_torch(monkeypatch, (2, 9))
    for name in [n for n in sys.modules if n.startswith("torch.distributed.flight_recorder.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch.distributed.flight_recorder", None)
    dumps = tmp_path / "flight_recorder"
    dumps.mkdir()
    entry = {"process_group": ("0", "default_pg"), "collective_seq_id": 1, "p2p_seq_id": 0, "is_p2p": False}
    (dumps / "gloo_trace_rank_0").write_bytes(pickle.dumps(
        {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [entry]}))
    StackDumper(dumps, rank=0, native=False).dump("a test")
    assert torchprof(["hang", str(tmp_path), "--brief"]) == 0
    out = capsys.readouterr().out
    assert "  rank 0: test_torch_support.py:" in out
    assert f"note: the gloo flight-recorder dumps were not analysed: {support.needs('torchprof hang')}" in out


def test_gloo_dump_missing_gives_the_reason_not_no_collectives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs) -> None:
    """torch before 2.8 has no _dump_fr_trace: the log line says so."""
    _pretend_torch(monkeypatch, (2, 6))
    monkeypatch.setattr(flight_recorder, "_dump_calls", dict)
    recorder = flight_recorder.FlightRecorder(str(tmp_path / "fr"), entries=10, rank=0)
    (tmp_path / "fr").mkdir()
    assert recorder.dump("a test") == []
    (line,) = logs.at(logging.WARNING)
    assert line.endswith("rank 0: flight recorder not dumped (a test): --torch-profile-flight-recorder (gloo "
                         "dumps) needs torch >= 2.8 (torch._C._distributed_c10d._dump_fr_trace is missing in "
                         "torch 2.6); upgrade torch to use it"), line


@pytest.mark.parametrize(("release", "via_stack"), [((2, 13), False), ((2, 14), True), ((2, 15), True)])
def test_with_modules_records_the_hierarchy_through_with_stack_where_deprecated(
        monkeypatch: pytest.MonkeyPatch, release: tuple[int, int], via_stack: bool) -> None:
    _pretend_torch(monkeypatch, release)
    args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(
        ["--torch-profile", "--torch-profile-with-modules"])
    trace = configs_from_args(args, world_size=1).profiler.trace
    assert trace.with_modules and trace.modules_via_stack is via_stack
    options = trace.profiler_options()
    assert (options["with_stack"], options["with_modules"]) == ((True, False) if via_stack else (False, True))
