"""``TraceWriter.submit``'s outcome: which way a trace went (forked, inline, failed, dropped), with the
trace's path, the reason, and the publication's future."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import faults
from helpers.processes import wait_until

from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export import writer as writer_module
from torchprof_args.capture.runtime.export.staging import LOCK_NAME, StagingArea
from torchprof_args.capture.runtime.export.writer import Route, TraceWriter

CYCLE, STEM = "iter000001-000002", "rank00000_host_pid1"


def export(path: str) -> None:
    Path(path).write_text(json.dumps(
        {"traceEvents": [{"name": "ProfilerStep#1", "ph": "X", "ts": 0, "dur": 1}]}))


def make_writer(tmp_path: Path, mode: str) -> TraceWriter:
    staging = StagingArea(str(tmp_path / "staging"))
    staging.open()
    config = ExportConfig(mode=mode, gzip_level=None, operator_table_rows=None, publish_wait="never")
    return TraceWriter(tmp_path / "out", staging, config, rank=0)


def published(tmp_path: Path) -> list[str]:
    return sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*")
                  if p.is_file())


def staged(writer: TraceWriter) -> list[str]:
    return [p.name for p in writer.staging.dirs[0].iterdir() if p.name != LOCK_NAME]



def close(writer: TraceWriter) -> None:
    writer.close(time.monotonic() + 60, "the test's deadline")


@pytest.mark.parametrize(("mode", "route"), [("fork", Route.FORKED), ("inline", Route.INLINE)])
def test_forked_and_inline_traces_go_to_the_publisher_and_their_future_tells_the_outcome(tmp_path, mode,
                                                                                      route):
    writer = make_writer(tmp_path, mode)
    outcome = writer.submit(export, CYCLE, STEM, steps=2)
    trace_path = str(tmp_path / "out" / CYCLE / f"{STEM}.pt.trace.json")
    assert outcome.route is route and outcome.error is None and outcome.outcome is not None
    assert outcome.trace_path == trace_path
    status = outcome.outcome.result(timeout=60)
    assert status.published and status.trace_path == trace_path and status.rank == 0
    assert writer.in_flight == 0 and writer.published == [trace_path] and staged(writer) == []
    close(writer)
    assert published(tmp_path) == [f"{CYCLE}/{STEM}.pt.trace.json"]


@pytest.mark.slow
@pytest.mark.skipif(not faults.can_limit_forks(), reason="needs a pids cgroup (root) or RLIMIT_NPROC")
def test_a_failed_fork_goes_inline_to_the_same_publisher(tmp_path, caplog):
    """A real EAGAIN from fork (a pids cgroup at its current count): the trace is exported on the
    training thread and published by the publisher started with the writer."""
    writer = make_writer(tmp_path, "fork")
    assert wait_until(lambda: bool(faults.publishers_of()))
    with faults.ForkLimit():
        outcome = writer.submit(export, CYCLE, STEM)
        assert outcome.route is Route.INLINE and outcome.outcome is not None
        assert outcome.outcome.result(timeout=60).published
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


def test_failed_export_and_a_closed_writer(tmp_path, caplog):
    writer = make_writer(tmp_path, "inline")

    def broken(path: str) -> None:
        Path(path).write_text('{"traceEvents": [')
        raise RuntimeError("injected")

    failed = writer.submit(broken, CYCLE, STEM)
    assert failed.route is Route.FAILED and failed.outcome is None
    assert failed.error == "RuntimeError: injected" and failed.trace_path.endswith(f"{STEM}.pt.trace.json")
    assert writer.stats["publish_failures"] == 1 and "could not export trace" in caplog.text
    assert staged(writer) == []
    close(writer)
    dropped = writer.submit(export, CYCLE, STEM)
    assert dropped.route is Route.DROPPED and dropped.trace_path is None and dropped.error
    assert published(tmp_path) == []
