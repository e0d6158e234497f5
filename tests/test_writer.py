"""``TraceWriter.submit``'s outcome: which way a trace went (forked, inline, published in process,
failed, dropped), with the trace's path, the watched process and the reason."""

from __future__ import annotations

import errno
import json
import subprocess
import time
from pathlib import Path

import pytest

from torchprof_args.runtime.config import ExportConfig
from torchprof_args.runtime.export import writer as writer_module
from torchprof_args.runtime.export.staging import LOCK_NAME, StagingArea
from torchprof_args.runtime.export.writer import Route, Submission, TraceWriter

CYCLE, STEM = "iter000001-000002", "rank00000_host_pid1"


def export(path: str) -> None:
    Path(path).write_text(json.dumps(
        {"traceEvents": [{"name": "ProfilerStep#1", "ph": "X", "ts": 0, "dur": 1}]}))


def make_writer(tmp_path: Path, mode: str, server: bool = True) -> TraceWriter:
    staging = StagingArea(str(tmp_path / "staging"))
    staging.open()
    config = ExportConfig(mode=mode, gzip_level=None, operator_table_rows=None, publisher_server=server)
    return TraceWriter(tmp_path / "out", staging, config, rank=0)


def published(tmp_path: Path) -> list[str]:
    return sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*")
                  if p.is_file())


def staged(writer: TraceWriter) -> list[str]:
    return [p.name for p in writer.staging.dirs[0].iterdir() if p.name != LOCK_NAME]


def close(writer: TraceWriter) -> None:
    writer.close(time.monotonic() + 60, "the test's deadline")


@pytest.mark.parametrize("server", [True, False], ids=["fork server", "a publisher per trace"])
@pytest.mark.parametrize(("mode", "route"), [("fork", Route.FORKED), ("inline", Route.INLINE)])
def test_forked_and_inline_traces_are_watched_until_published(tmp_path, mode, route, server):
    writer = make_writer(tmp_path, mode, server)
    outcome = writer.submit(export, CYCLE, STEM, steps=2)
    trace_path = str(tmp_path / "out" / CYCLE / f"{STEM}.pt.trace.json")
    assert outcome.route is route and outcome.pending and outcome.error is None
    # inline with the fork server: the reaper thread hands the staged trace to it (no process yet)
    assert (outcome.pid is None) == (server and mode == "inline")
    assert outcome.trace_path == trace_path
    close(writer)
    assert writer.published == [trace_path] and published(tmp_path) == [f"{CYCLE}/{STEM}.pt.trace.json"]


def test_a_failed_fork_goes_inline(tmp_path, monkeypatch, caplog):
    def no_fork(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(writer_module, "fork_export", no_fork)
    writer = make_writer(tmp_path, "fork")
    outcome = writer.submit(export, CYCLE, STEM)
    assert outcome.route is Route.INLINE and outcome.pending
    close(writer)
    assert "fork failed (Resource temporarily unavailable)" in caplog.text
    assert published(tmp_path) == [f"{CYCLE}/{STEM}.pt.trace.json"]


@pytest.mark.slow
def test_a_slow_fork_is_reported_once_with_its_cause(tmp_path, monkeypatch, caplog):
    """What cudaHostRegister-pinned memory does to fork() on a GPU node (seconds: every pinned page
    is copied), stood in for by a fork that takes 1.2 s in the parent: one warning per run, naming
    the cost, the cause and the ways out; both traces still go out forked."""
    real_fork = writer_module.fork_export

    def slow_fork(*args, **kwargs):
        time.sleep(writer_module.SLOW_FORK_S + 0.2)
        return real_fork(*args, **kwargs)

    monkeypatch.setattr(writer_module, "fork_export", slow_fork)
    writer = make_writer(tmp_path, "fork")
    outcomes = [writer.submit(export, cycle, STEM) for cycle in (CYCLE, "iter000003-000004")]
    close(writer)
    assert [o.route for o in outcomes] == [Route.FORKED, Route.FORKED]
    warnings = [r.getMessage() for r in caplog.records if "fork() for the trace export" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "rank 0" in warnings[0] and "cudaHostRegister" in warnings[0] and "--torch-profile-export inline" \
        in warnings[0]
    assert len(published(tmp_path)) == 2


def test_published_in_process_when_no_publisher_can_start(tmp_path, monkeypatch):
    def no_process(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", no_process)  # nor the fork server
    writer = make_writer(tmp_path, "inline")
    outcome = writer.submit(export, CYCLE, STEM)
    assert outcome == Submission(Route.IN_PROCESS, str(tmp_path / "out" / CYCLE / f"{STEM}.pt.trace.json"))
    assert not outcome.pending and writer.in_flight == 0
    # The outcome is recorded at once, as the reaper would have.
    assert writer.published == [outcome.trace_path] and writer.stats["traces_written"] == 1
    assert staged(writer) == [], "the job and staged files are removed"
    close(writer)


def test_failed_export_and_a_closed_writer(tmp_path, caplog):
    writer = make_writer(tmp_path, "inline")

    def broken(path: str) -> None:
        Path(path).write_text('{"traceEvents": [')
        raise RuntimeError("injected")

    failed = writer.submit(broken, CYCLE, STEM)
    assert failed.route is Route.FAILED and not failed.pending
    assert failed.error == "RuntimeError: injected" and failed.trace_path.endswith(f"{STEM}.pt.trace.json")
    assert writer.stats["publish_failures"] == 1 and "could not export trace" in caplog.text
    assert staged(writer) == []
    close(writer)
    dropped = writer.submit(export, CYCLE, STEM)
    assert dropped.route is Route.DROPPED and dropped.trace_path is None and dropped.error
    assert published(tmp_path) == []
