"""The per-trace pipeline (``analysis/collect/trace_results.py``): one trace's parts from its sidecar,
else parsed once; what is kept when a part or the sidecar cannot be written."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers.inject import load_doc, write_doc
from helpers.paths import DATA

from torchprof_args.analysis.collect import trace_results
from torchprof_args.analysis.collect.pool import collect
from torchprof_args.analysis.collect.trace_results import (
    CRITICAL_PATH,
    DIAGNOSIS,
    MEMORY,
    PARTS,
    SUMMARY,
    Failure,
    parse_results,
    read_results,
    results_of,
)
from torchprof_args.naming import sidecar_path

SMALL = DATA / "gpu_1rank_simple_add_kineto.json.gz"


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "rank00000_host_pid1.pt.trace.json.gz"
    shutil.copy(SMALL, path)
    return path


def test_parsed_once_the_sidecar_gives_the_same_parts(trace: Path) -> None:
    parsed = parse_results(trace, PARTS, top=None, write=True)
    assert parsed.error is None and parsed.sidecar_written and parsed.parsed_bytes > 0
    read = read_results(trace, PARTS, top=None)
    assert read is not None and parsed.results is not None
    assert read.summary == parsed.results.summary and read.diagnosis == parsed.results.diagnosis
    again = results_of(trace, (DIAGNOSIS,))
    assert again.from_sidecar and again.results is not None and again.results.summary is None
    assert results_of(trace, (DIAGNOSIS,), reparse=True).from_sidecar is False


def test_a_stored_summary_is_decoded_with_its_schema_and_one_that_does_not_fit_is_parsed_again(
        trace: Path) -> None:
    parsed = parse_results(trace, (SUMMARY,), top=None, write=True)
    assert parsed.results is not None and parsed.results.summary is not None
    read = read_results(trace, (SUMMARY,), top=None)
    assert read is not None and read.summary == parsed.results.summary  # the struct, typed
    assert read.summary is not None and read.summary.gpu is not None and read.summary.gpu.kernels > 0
    doc = json.loads(sidecar_path(trace).read_text())
    doc["summary"]["events"] = "many"  # valid JSON, not a summary: a foreign or damaged sidecar
    sidecar_path(trace).write_text(json.dumps(doc))
    assert read_results(trace, (SUMMARY,)) is None
    outcome = results_of(trace, (SUMMARY,), top=None)
    assert not outcome.from_sidecar and outcome.results is not None
    assert outcome.results.summary == read.summary


def test_a_part_only_the_sidecar_wants_that_fails_is_stored_as_null(
        trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*_: object) -> None:
        raise RuntimeError("injected: the diagnosis fails")

    broken = dataclasses.replace(DIAGNOSIS, compute=fails)
    monkeypatch.setattr(trace_results, "PARTS", (SUMMARY, broken))
    outcome = parse_results(trace, (SUMMARY,), write=True)
    assert outcome.error is None and outcome.sidecar_written  # the summary is not lost to it
    assert outcome.results is not None and outcome.results.summary is not None
    assert '"diagnosis":null' in sidecar_path(trace).read_text()
    monkeypatch.undo()
    assert read_results(trace, (SUMMARY,)) is not None
    assert read_results(trace, (DIAGNOSIS,)) is None  # then the trace is parsed
    got = collect([trace], parts=(DIAGNOSIS,))
    assert got.from_sidecars == 0 and got.parsed == 1 and len(got.diagnoses) == 1
    with pytest.raises(RuntimeError, match="injected"):  # a part asked for is not hidden
        monkeypatch.setattr(trace_results, "PARTS", (SUMMARY, broken))
        parse_results(trace, (broken,), write=True)


def test_a_sidecar_that_cannot_be_written_is_the_error_and_the_parts_still_come(trace: Path) -> None:
    (trace.parent / "summaries").write_text("a file where the folder goes")
    outcome = parse_results(trace, (SUMMARY,), write=True)
    assert not outcome.sidecar_written and outcome.results is not None and outcome.results.summary
    assert outcome.error is not None and outcome.error.kind is Failure.NO_SIDECAR
    assert str(outcome.error).startswith(f"{trace}: cannot write its sidecar")
    assert sorted(p.name for p in trace.parent.iterdir()) == [trace.name, "summaries"]  # nothing half-written


def test_an_unreadable_trace_is_one_line_never_an_exception(tmp_path: Path) -> None:
    bad = tmp_path / "rank00000_host_pid1.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": ')
    outcome = results_of(bad, PARTS)
    assert outcome.results is None and outcome.error is not None and outcome.error.kind is Failure.INVALID
    assert str(bad) in str(outcome.error) and "\n" not in str(outcome.error)
    assert not sidecar_path(bad).exists()


def test_a_trace_without_its_rank_is_numbered_from_its_file_name(tmp_path: Path) -> None:
    doc = load_doc(SMALL)
    doc.pop("distributedInfo", None)
    path = write_doc(doc, tmp_path, "rank00007_host_pid1.pt.trace.json.gz")
    parsed = parse_results(path, (DIAGNOSIS,), write=True)
    assert parsed.results is not None and parsed.results.diagnosis is not None
    assert parsed.results.diagnosis.rank == 7
    assert '"rank":null' in sidecar_path(path).read_text()  # the sidecar keeps what the trace says
    read = read_results(path, (DIAGNOSIS,))
    assert read is not None and read.diagnosis is not None and read.diagnosis.rank == 7


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(DATA.glob("*.json.gz")), ids=lambda p: p.name)
def test_every_part_computed_is_what_its_sidecar_gives_back(path: Path, tmp_path: Path) -> None:
    trace = tmp_path / path.name
    shutil.copy(path, trace)
    parsed = parse_results(trace, PARTS, top=None, write=True)  # no JSON round trip: plain finite values
    assert parsed.results is not None and parsed.error is None
    assert read_results(trace, PARTS, top=None) == parsed.results


def test_a_part_of_another_format_is_refused_and_the_trace_parsed_again(trace: Path) -> None:
    parsed = parse_results(trace, PARTS, top=None, write=True)
    doc = json.loads(sidecar_path(trace).read_text())
    doc["diagnosis"]["format"] -= 1  # an older (or foreign) diagnosis beside a usable summary
    sidecar_path(trace).write_text(json.dumps(doc))
    assert read_results(trace, (SUMMARY,)) is not None and read_results(trace, (DIAGNOSIS,)) is None
    outcome = results_of(trace, (DIAGNOSIS,))
    assert not outcome.from_sidecar and outcome.parsed_bytes > 0 and outcome.results is not None
    assert parsed.results is not None and outcome.results.diagnosis == parsed.results.diagnosis


def test_a_sidecar_is_read_once_with_its_optional_parts(trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parse_results(trace, PARTS, write=True)
    reads: list[Path] = []
    stored_parts = trace_results.stored_parts
    monkeypatch.setattr(trace_results, "stored_parts", lambda path: reads.append(path) or stored_parts(path))
    got = collect([trace], parts=(DIAGNOSIS, CRITICAL_PATH, MEMORY.if_stored()))
    assert reads == [trace] and got.from_sidecars == 1 and got.parsed == 0 and len(got.memory) == 1
    doc = json.loads(sidecar_path(trace).read_text())
    doc["critical_path"] = None  # left out (over the analysis budget): parsed, the memory part still read
    sidecar_path(trace).write_text(json.dumps(doc))
    reads.clear()
    got = collect([trace], parts=(DIAGNOSIS, CRITICAL_PATH, MEMORY.if_stored()))
    assert reads == [trace] and got.parsed == 1 and len(got.paths) == 1 and len(got.memory) == 1
    doc["memory"] = None  # an optional part not kept: neither parsed for nor an error
    sidecar_path(trace).write_text(json.dumps(doc))
    got = collect([trace], parts=(SUMMARY, MEMORY.if_stored()))
    assert got.from_sidecars == 1 and got.parsed == 0 and got.memory == [] and not got.errors
