"""The publisher fork server on real processes: traces published by its workers, and its failures (the
server killed, a worker killed mid-publish, a server that does not answer, a rejected job, the
training process gone): training goes on, one line names the rank and the reason, nothing
half-written is visible, nothing is left in staging, and later traces still get published."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import faults
from helpers.paths import DATA

from torchprof_args.runtime.config import ExportConfig
from torchprof_args.runtime.export.forkserver import ForkServer
from torchprof_args.runtime.export.job import PublishJob
from torchprof_args.runtime.export.publisher import publisher_env
from torchprof_args.runtime.export.staging import LOCK_NAME, StagingArea
from torchprof_args.runtime.export.status import read_status
from torchprof_args.runtime.export.writer import Route, TraceWriter

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")]

#: a real torch.profiler trace (2-rank gloo job, shapes recorded), 2.9 MB uncompressed
REAL_TRACE = gzip.decompress((DATA / "cpu_2rank_gloo_rank0_iter3.json.gz").read_bytes())
STEM = "rank00000_host_pid1"


def export(path: str) -> None:
    Path(path).write_bytes(REAL_TRACE)


def export_large(path: str) -> None:
    """The real trace's events ten times over (~30 MB): a worker takes a while to publish it."""
    trace = json.loads(REAL_TRACE)
    trace["traceEvents"] = trace["traceEvents"] * 10
    Path(path).write_text(json.dumps(trace))


def make_writer(tmp_path: Path, mode: str = "fork", **config: object) -> TraceWriter:
    staging = StagingArea(str(tmp_path / "staging"))
    staging.open()
    writer = TraceWriter(tmp_path / "out", staging, ExportConfig(mode=mode, **config), rank=0)  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    while not writer.publishers.server_ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.publishers.server_ready(), "the fork server did not start"
    return writer


def close(writer: TraceWriter) -> None:
    writer.close(time.monotonic() + 60, "the test's deadline")


def published(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def staged(writer: TraceWriter) -> list[str]:
    return [p.name for d in writer.staging.dirs if d.is_dir() for p in d.iterdir() if p.name != LOCK_NAME]


def running(pid: int) -> bool:
    return bool(faults.cmdline(pid))  # a zombie's command line is empty


def wait_until(condition, seconds: float = 30.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Warnings and errors, without the ``[torchprof rank R]`` prefix of every line."""
    return [r.getMessage().removeprefix(f"[torchprof rank {r.rank}] ") for r in caplog.records  # type: ignore[attr-defined]
            if r.levelname in ("WARNING", "ERROR")]


@pytest.mark.parametrize("mode", ["fork", "inline"])
def test_workers_of_the_server_publish_what_a_publisher_process_would(tmp_path: Path, mode: str) -> None:
    writer = make_writer(tmp_path, mode)
    server = writer.publishers.server_pid
    assert server is not None and running(server)
    # the server runs at the publishers' priority (idle by default): its workers inherit it
    assert os.getpriority(os.PRIO_PROCESS, server) == 19 and os.sched_getscheduler(server) == os.SCHED_IDLE
    outcomes = [writer.submit(export, cycle, STEM, steps=2) for cycle in ("iter000001-000002",
                                                                          "iter000003-000004")]
    assert all(o.route is (Route.FORKED if mode == "fork" else Route.INLINE) and o.pending for o in outcomes)
    close(writer)
    assert not running(server), "the server exits with the writer"
    assert writer.stats["traces_written"] == 2 and writer.stats["publish_failures"] == 0
    for cycle in ("iter000001-000002", "iter000003-000004"):
        assert f"{cycle}/{STEM}.pt.trace.json.gz" in published(tmp_path)
        assert f"{cycle}/summaries/{STEM}.summary.json" in published(tmp_path)
        data = gzip.decompress((tmp_path / "out" / cycle / f"{STEM}.pt.trace.json.gz").read_bytes())
        assert data == REAL_TRACE
    summary = json.loads((tmp_path / "out" / "iter000001-000002" / "summaries" / f"{STEM}.summary.json")
                         .read_text())
    assert summary["summary"]["events"] > 5000 and summary["diagnosis"] is not None
    # the publication's CPU time: the worker's, plus the forked exporter's (fork mode)
    assert writer.stats["publish_cpu_seconds"] > 0
    assert not any(p.name.startswith(".partial-") for p in (tmp_path / "out").rglob("*"))


def test_a_killed_server_gives_way_to_a_publisher_process_per_trace(tmp_path: Path, caplog) -> None:
    writer = make_writer(tmp_path, "fork", gzip_level=1)
    server = writer.publishers.server_pid
    assert server is not None
    os.kill(server, signal.SIGKILL)
    assert wait_until(lambda: not running(server))
    first = writer.submit(export, "iter000001-000001", STEM)
    second = writer.submit(export, "iter000002-000002", STEM)
    assert first.route is Route.FORKED and second.route is Route.FORKED
    close(writer)
    lost = [e for e in errors(caplog) if "fork server" in e]
    assert lost == ["rank 0: the publisher fork server has ended (killed by SIGKILL); from now on each trace "
                    "starts a publisher process"], errors(caplog)
    assert writer.stats["traces_written"] == 2 and writer.stats["publish_failures"] == 0
    assert staged(writer) == []


def test_a_worker_killed_mid_publish_is_reported_and_the_next_trace_is_published(tmp_path: Path,
                                                                                  caplog) -> None:
    writer = make_writer(tmp_path, "inline", publish_wait="never")
    server = writer.publishers.server_pid
    assert server is not None
    killed = writer.submit(export_large, "iter000001-000001", STEM)
    assert wait_until(lambda: bool(faults.children(server)))
    (worker,) = faults.children(server)
    os.kill(worker, signal.SIGKILL)  # long before it is done
    assert writer._reaper.wait_all(time.monotonic() + 30)  # noqa: SLF001
    after = writer.submit(export, "iter000002-000002", STEM)
    close(writer)
    assert killed.trace_path and after.trace_path
    (error,) = [e for e in errors(caplog) if "was not written" in e]
    assert error == (f"rank 0: trace {killed.trace_path} was not written: the fork server's publisher "
                     f"(pid {worker}) was killed by SIGKILL")
    assert published(tmp_path) == ["iter000002-000002/rank00000_host_pid1.pt.trace.json.gz",
                                   "iter000002-000002/summaries/rank00000_host_pid1.operator_table.txt",
                                   "iter000002-000002/summaries/rank00000_host_pid1.summary.json"]
    assert staged(writer) == [] and writer.stats["publish_failures"] == 1


def test_a_flush_that_waits_returns_with_its_trace_published(tmp_path: Path) -> None:
    """--torch-profile-publish-wait always: the forked export and the worker's publication are done
    when submit returns (on a busy node, 'auto' does this)."""
    writer = make_writer(tmp_path, "fork", publish_wait="always", publish_wait_timeout=60.0)
    outcome = writer.submit(export, "iter000001-000001", STEM)
    assert outcome.route is Route.FORKED and writer.in_flight == 0
    assert writer.stats["traces_written"] == 1 and writer.stats["publications_waited_for"] == 1
    assert outcome.trace_path and Path(outcome.trace_path).is_file() and staged(writer) == []
    close(writer)


def test_a_wait_ends_at_its_timeout_and_the_publication_goes_on(tmp_path: Path) -> None:
    writer = make_writer(tmp_path, "inline", publish_wait="always", publish_wait_timeout=0.05)
    started = time.monotonic()
    outcome = writer.submit(export_large, "iter000001-000001", STEM)
    waited = time.monotonic() - started
    assert writer.in_flight == 1 and writer.stats["publication_waits_timed_out"] == 1, waited
    close(writer)
    assert writer.stats["traces_written"] == 1 and outcome.trace_path and Path(outcome.trace_path).is_file()
    assert staged(writer) == []


def test_a_worker_killed_while_the_flush_waits_ends_the_wait(tmp_path: Path, caplog) -> None:
    writer = make_writer(tmp_path, "inline", publish_wait="always", publish_wait_timeout=120.0)
    server = writer.publishers.server_pid
    assert server is not None
    killed: list[int] = []

    def kill_the_worker() -> None:
        if wait_until(lambda: bool(faults.children(server))):
            killed.extend(faults.children(server))
            os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    started = time.monotonic()
    outcome = writer.submit(export_large, "iter000001-000001", STEM)
    waited = time.monotonic() - started
    killer.join()
    assert killed and waited < 60 and writer.in_flight == 0, waited
    (error,) = [e for e in errors(caplog) if "was not written" in e]
    assert error == (f"rank 0: trace {outcome.trace_path} was not written: the fork server's publisher "
                     f"(pid {killed[0]}) was killed by SIGKILL")
    close(writer)
    assert published(tmp_path) == [] and staged(writer) == [] and writer.stats["publish_failures"] == 1

def test_a_server_that_does_not_answer_fails_its_trace_at_the_flush_timeout(tmp_path: Path, caplog) -> None:
    """Frozen (SIGSTOP) before the trace reaches it: the trace fails when the flush timeout is up, the
    server is stopped, and the next trace goes to a publisher process."""
    writer = make_writer(tmp_path, "fork", flush_timeout=3.0)
    server = writer.publishers.server_pid
    assert server is not None
    os.kill(server, signal.SIGSTOP)
    try:
        frozen = writer.submit(export, "iter000001-000001", STEM)
        assert writer._reaper.wait_all(time.monotonic() + 30)  # noqa: SLF001
    finally:
        with contextlib.suppress(ProcessLookupError):  # stopped for good meanwhile
            os.kill(server, signal.SIGCONT)
    after = writer.submit(export, "iter000002-000002", STEM)
    close(writer)
    lines = errors(caplog)
    assert [e for e in lines if "was not written" in e] == [
        f"rank 0: trace {frozen.trace_path} was not written: the publisher fork server did not start a "
        "worker for it before --torch-profile-flush-timeout"], lines
    assert len([e for e in lines if "from now on each trace starts a publisher process" in e]) == 1
    assert not running(server)
    assert after.trace_path and Path(after.trace_path).is_file() and staged(writer) == []
    assert not [p for p in (tmp_path / "out").rglob("*") if p.name.startswith(".partial-")]


def test_a_job_outside_the_server_s_directories_is_rejected_by_its_worker(tmp_path: Path) -> None:
    staging, output = tmp_path / "staging", tmp_path / "out"
    staging.mkdir(mode=0o700)
    output.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    job_path = staging / "r.job.json"
    PublishJob(str(victim), str(output / "r.pt.trace.json.gz")).save(job_path)
    server = ForkServer.start([str(staging)], str(output), "normal", publisher_env())
    try:
        read, write = os.pipe()
        worker = server.start_worker(str(job_path), write, time.monotonic() + 60)
        os.close(write)
        assert server.wait_worker(worker, time.monotonic() + 60) is not None
        status = read_status(read)
        os.close(read)
    finally:
        server.close()
    assert status is not None and "publisher rejected the job" in (status.error or "")
    assert victim.read_text() == "keep me" and list(output.iterdir()) == []
    assert server.process.returncode == 0


_TRAINER = """
import sys, time
from pathlib import Path
from torchprof_args.runtime.config import ExportConfig
from torchprof_args.runtime.export.staging import StagingArea
from torchprof_args.runtime.export.writer import TraceWriter
staging = StagingArea(sys.argv[1]); staging.open()
writer = TraceWriter(sys.argv[2], staging, ExportConfig(), rank=0)
print(writer.publishers.server_pid, flush=True)
time.sleep(600)
"""


def test_the_server_exits_when_the_training_process_is_killed(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", _TRAINER, str(tmp_path / "staging"), str(tmp_path / "out")]
    (tmp_path / "tmp").mkdir()  # its staging fallback: a killed trainer's is swept by the next job's
    trainer = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                               env={**publisher_env(), "TMPDIR": str(tmp_path / "tmp")})
    try:
        assert trainer.stdout is not None
        server = int(trainer.stdout.readline())
        assert running(server)
    finally:
        trainer.kill()
        trainer.wait()
    assert wait_until(lambda: not running(server)), "the server outlived the training process"
