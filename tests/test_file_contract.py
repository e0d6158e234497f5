"""The file contract (``shared/formats.py``): for every format, a file of another version is read
again from its source or refused in one line that names it; never a traceback, never a wrong read.

Each format of :data:`formats.FORMATS` has its case here (a test fails for a format without one),
writing a real file of the current version the way the job writes it and then one of another
version.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.paths import DATA

from torchprof_args.analysis.analyzers.compiled.kernel_modules import kernel_modules_file
from torchprof_args.analysis.collect.sidecar import write_sidecar
from torchprof_args.analysis.collect.trace_results import PARTS, SUMMARY, parse_results, read_stored
from torchprof_args.analysis.tools.debug_dumps import find_server_dumps
from torchprof_args.capture.ondemand.protocol import RequestRejected, parse_request
from torchprof_args.capture.stacks.dumper import StackDumper
from torchprof_args.console import main as torchprof
from torchprof_args.naming import (
    COMPILED_MODULES_SUBDIR,
    DEBUG_SERVER_DUMPS,
    EXPERT_TOKENS_SUFFIX,
    sidecar_path,
)
from torchprof_args.shared import formats
from torchprof_args.shared.expert_tokens_file import load_expert_tokens, make_document
from torchprof_args.shared.kernel_modules import (
    CompiledGraph,
    GraphKernel,
    encode_kernel_modules,
    read_kernel_modules,
)
from torchprof_args.shared.metrics_log import RunMarker, read_runs
from torchprof_args.shared.stacks_file import load_stacks

#: a real 2-rank gloo trace with collectives: every sidecar part has something to say.
TRACE = DATA / "cpu_2rank_gloo_rank0_iter3.json.gz"

CASES: dict[str, Callable[[Path, pytest.CaptureFixture[str]], None]] = {}


def _case(fmt: formats.FileFormat) -> Callable[[Callable[[Path, pytest.CaptureFixture[str]], None]],
                                              Callable[[Path, pytest.CaptureFixture[str]], None]]:
    def register(check: Callable[[Path, pytest.CaptureFixture[str]], None]
                 ) -> Callable[[Path, pytest.CaptureFixture[str]], None]:
        CASES[fmt.name] = check
        return check
    return register


def _published_trace(folder: Path) -> Path:
    """A trace with a whole sidecar, as the publisher leaves it."""
    trace = folder / "rank00000_h_pid1.pt.trace.json.gz"
    shutil.copy(TRACE, trace)
    results = parse_results(trace, PARTS, top=None).results
    assert results is not None
    write_sidecar(trace, {part.name: getattr(results, part.name) for part in PARTS})
    assert read_stored(trace, PARTS, top=None)[1], "the current version's sidecar is read whole"
    return trace


def _rewrite_sidecar(trace: Path, change: Callable[[dict], None]) -> None:
    doc = json.loads(sidecar_path(trace).read_text())
    change(doc)
    sidecar_path(trace).write_text(json.dumps(doc))


@_case(formats.SIDECAR)
def _sidecar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _published_trace(tmp_path)
    _rewrite_sidecar(trace, lambda doc: doc.update(version=formats.SIDECAR.version - 1))
    assert read_stored(trace, PARTS) == ({}, False)  # every part: parsed from the trace again
    assert torchprof(["summary", "--json", "--no-progress", str(trace)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["rank"] == 0
    assert captured.err.splitlines() == [
        f"torchprof summary: 1 trace(s) parsed again: their sidecars were written by another version of "
        f"torchprof-args (sidecar version {formats.SIDECAR.version - 1}, this one reads "
        f"{formats.SIDECAR.version}); `torchprof summary --write-sidecars` rewrites them"]


def _part_of_another_format(name: str) -> Callable[[Path, pytest.CaptureFixture[str]], None]:
    """A sidecar part of another format: that part is parsed again, the others are still read."""
    def check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        trace = _published_trace(tmp_path)
        _rewrite_sidecar(trace, lambda doc: doc[name].update(format=doc[name]["format"] - 1))
        values, complete = read_stored(trace, PARTS, top=None)
        assert not complete and name not in values
        assert set(values) == {p.name for p in PARTS} - {name}
        assert read_stored(trace, (SUMMARY,), top=None)[1]  # a command that needs only the others
    return check


_case(formats.DIAGNOSIS)(_part_of_another_format("diagnosis"))
_case(formats.PATHS)(_part_of_another_format("critical_path"))
_case(formats.MEMORY)(_part_of_another_format("memory"))


@_case(formats.FINDINGS)
def _findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _published_trace(tmp_path)
    assert torchprof(["diagnose", "--json", "--no-progress", str(trace)]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["version"] == formats.FINDINGS.version


@_case(formats.METRICS_RUN)
def _metrics_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "metrics.jsonl"
    older, newer = (RunMarker(f"r{v}", 10.0, 0, 9.0, 1, "h", 1).record() for v in (1, 2))
    older["run"].pop("version")  # the first runs carried none
    path.write_text(json.dumps(older) + "\n")
    assert [segment.marker.id for segment in read_runs(path)] == ["r1"]
    newer["run"]["version"] = formats.METRICS_RUN.version + 1
    path.write_text(json.dumps(newer) + "\n")
    assert torchprof(["goodput", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}:1: " in err[0] and "upgrade torchprof-args" in err[0]


@_case(formats.STACKS)
def _stacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = StackDumper(tmp_path, rank=3).dump("a test")
    assert path is not None and load_stacks(path)["rank"] == 3
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "version": formats.STACKS.version + 1}))
    with pytest.raises(ValueError) as err:
        load_stacks(path)
    line = str(err.value)
    assert "\n" not in line and str(path) in line
    assert str(formats.STACKS.version) in line and str(formats.STACKS.version + 1) in line


@_case(formats.ONDEMAND)
def _ondemand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = {"version": formats.ONDEMAND.version, "id": "abc", "iterations": 2}
    assert parse_request(json.dumps(request).encode(), request_id="abc", world_size=2,
                         max_iterations=10).iterations == 2
    request["version"] = formats.ONDEMAND.version + 1
    with pytest.raises(RequestRejected) as err:
        parse_request(json.dumps(request).encode(), request_id="abc", world_size=2, max_iterations=10)
    line = str(err.value)
    assert "\n" not in line and f"version {formats.ONDEMAND.version + 1}" in line
    assert f"version {formats.ONDEMAND.version})" in line


@_case(formats.DEBUG_SERVER_FR)
def _debug_server_fr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "debug_server"
    folder.mkdir()
    dump = {"format": formats.DEBUG_SERVER_FR.name, "version": formats.DEBUG_SERVER_FR.version,
            "world_size": 1, "time": 1.0,
            "ranks": {"0": {"address": "h:1", "recorders": {"gloo": {"entries": [{"record_id": 0}]}},
                            "errors": {}}}}
    path = folder / f"{DEBUG_SERVER_DUMPS['flight_recorder']}_1.txt"
    path.write_text(json.dumps(dump))
    found = find_server_dumps(tmp_path)
    assert found is not None and found.recorders["gloo"][0]["entries"] and not found.problems
    path.write_text(json.dumps({**dump, "version": formats.DEBUG_SERVER_FR.version + 1}))
    found = find_server_dumps(tmp_path)
    assert found is not None and not found.recorders
    assert len(found.problems) == 1 and str(path) in found.problems[0] and "\n" not in found.problems[0]


@_case(formats.EXPERT_TOKENS)
def _expert_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"rank00000_h_pid1{EXPERT_TOKENS_SUFFIX}"
    doc = make_document(rank=0, source="a test", iterations=[3], layers=["layers.1.moe"], experts=2,
                        ep_ranks=[0, 1], counts=[[[5.0, 7.0]]])
    path.write_text(json.dumps(doc))
    assert load_expert_tokens(path)["counts"] == [[[5.0, 7.0]]]
    path.write_text(json.dumps({**doc, "version": formats.EXPERT_TOKENS.version + 1}))
    with pytest.raises(ValueError) as err:
        load_expert_tokens(path)
    line = str(err.value)
    assert "\n" not in line and str(path) in line
    assert str(formats.EXPERT_TOKENS.version) in line and str(formats.EXPERT_TOKENS.version + 1) in line


@_case(formats.KERNEL_MODULES)
def _kernel_modules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "prof" / COMPILED_MODULES_SUBDIR
    folder.mkdir(parents=True)
    path = folder / "rank00000_h_pid1.json"
    graphs = [CompiledGraph(0, "forward", [GraphKernel("cpp_fused_relu_0", ["relu"], "layers.0.mlp")])]
    path.write_bytes(encode_kernel_modules(graphs))  # the job's encoder
    trace = tmp_path / "prof" / "iter000001-000002" / "rank00000_h_pid1.pt.trace.json.gz"
    assert kernel_modules_file(trace) == path and read_kernel_modules(path).graphs == graphs
    record = json.loads(path.read_text())
    for other in ({**record, "version": formats.KERNEL_MODULES.version + 1}, "{not json"):
        path.write_text(other if isinstance(other, str) else json.dumps(other))
        with pytest.raises(ValueError) as err:
            read_kernel_modules(path)
        line = str(err.value)
        assert "\n" not in line and str(path) in line
        if not isinstance(other, str):
            assert f"version {formats.KERNEL_MODULES.version + 1}" in line
            assert f"reads version {formats.KERNEL_MODULES.version}" in line


@pytest.mark.parametrize("fmt", formats.FORMATS, ids=lambda f: f.name)
def test_a_file_of_another_version_is_read_again_or_refused_in_one_line(
        fmt: formats.FileFormat, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fmt.name in CASES, f"{fmt.name}: no case in tests/test_file_contract.py for its other versions"
    CASES[fmt.name](tmp_path, capsys)


def test_every_format_is_named_once_and_says_why_it_was_last_bumped() -> None:
    assert len({f.name for f in formats.FORMATS}) == len(formats.FORMATS)
    for fmt in formats.FORMATS:
        assert fmt.version >= 1 and len(fmt.history) <= fmt.version - 1, fmt.name
        if fmt.version > 1:
            assert fmt.history and fmt.history[0].startswith(f"{fmt.version}: "), fmt.name
