"""The rank's publisher on real processes: one long-lived process per traced rank publishes every
trace, forked or inline, and its failures (killed mid-publication, killed while the flush waits,
frozen past the flush timeout, no process can start, a job outside its directories, the training
process gone): training goes on, one line names the rank and the reason, nothing half-written is
visible, nothing is left in staging, and the next trace starts a new publisher."""

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
from helpers.processes import wait_until

from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export.job import PublishJob
from torchprof_args.capture.runtime.export.publisher import PublisherProcess, publisher_env
from torchprof_args.capture.runtime.export.staging import LOCK_NAME, StagingArea
from torchprof_args.capture.runtime.export.writer import Route, TraceWriter

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")]

#: a real torch.profiler trace (2-rank gloo job, shapes recorded), 2.9 MB uncompressed
REAL_TRACE = gzip.decompress((DATA / "cpu_2rank_gloo_rank0_iter3.json.gz").read_bytes())
STEM = "rank00000_host_pid1"


def export(path: str) -> None:
    Path(path).write_bytes(REAL_TRACE)


def export_large(path: str) -> None:
    """The real trace's events ten times over (~30 MB): the publisher takes a while to publish it."""
    trace = json.loads(REAL_TRACE)
    trace["traceEvents"] = trace["traceEvents"] * 10
    Path(path).write_text(json.dumps(trace))



def publisher() -> int:
    """The one publisher of this (training) process, once it runs."""
    assert wait_until(lambda: len(faults.publishers_of()) == 1), faults.publishers_of()
    (pid,) = faults.publishers_of()
    return pid


def make_writer(tmp_path: Path, mode: str = "fork", **config: object) -> TraceWriter:
    staging = StagingArea(str(tmp_path / "staging"))
    staging.open()
    return TraceWriter(tmp_path / "out", staging, ExportConfig(mode=mode, **config), rank=0)  # type: ignore[arg-type]


def close(writer: TraceWriter) -> None:
    writer.close(time.monotonic() + 60, "the test's deadline")


def published(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def partials(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "out").rglob("*") if p.name.startswith(".partial-")]


def staged(writer: TraceWriter) -> list[str]:
    return [p.name for d in writer.staging.dirs if d.is_dir() for p in d.iterdir() if p.name != LOCK_NAME]


def running(pid: int) -> bool:
    return bool(faults.cmdline(pid))  # a zombie's command line is empty


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Warnings and errors, without the ``[torchprof rank R]`` prefix of every line."""
    return [r.getMessage().removeprefix(f"[torchprof rank {r.rank}] ") for r in caplog.records  # type: ignore[attr-defined]
            if r.levelname in ("WARNING", "ERROR")]


def kill_mid_publication(tmp_path: Path) -> int:
    """SIGKILL the publisher once its hidden partial trace is in the output folder; its pid."""
    pid = publisher()
    assert wait_until(lambda: bool(partials(tmp_path)), 60), "the publisher never started writing"
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.parametrize("mode", ["fork", "inline"])
def test_one_publisher_publishes_every_trace_of_the_rank(tmp_path: Path, mode: str) -> None:
    writer = make_writer(tmp_path, mode, publish_wait="never")
    pid = publisher()  # started with the writer: its imports are paid while training starts
    # it runs at the publishers' priority (idle by default), lowered first thing
    assert wait_until(lambda: os.getpriority(os.PRIO_PROCESS, pid) == 19)
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    outcomes = [writer.submit(export, cycle, STEM, steps=2) for cycle in ("iter000001-000002",
                                                                          "iter000003-000004")]
    assert all(o.route is (Route.FORKED if mode == "fork" else Route.INLINE) for o in outcomes)
    assert all(o.outcome is not None and o.outcome.result(60).published for o in outcomes)
    assert faults.publishers_of() == [pid], "both traces went to the same publisher"
    close(writer)
    assert wait_until(lambda: not running(pid)), "the publisher exits with the writer"
    assert writer.stats["traces_written"] == 2 and writer.stats["publish_failures"] == 0
    for cycle in ("iter000001-000002", "iter000003-000004"):
        assert f"{cycle}/{STEM}.pt.trace.json.gz" in published(tmp_path)
        assert f"{cycle}/summaries/{STEM}.summary.json" in published(tmp_path)
        data = gzip.decompress((tmp_path / "out" / cycle / f"{STEM}.pt.trace.json.gz").read_bytes())
        assert data == REAL_TRACE
    summary = json.loads((tmp_path / "out" / "iter000001-000002" / "summaries" / f"{STEM}.summary.json")
                         .read_text())
    assert summary["summary"]["events"] > 5000 and summary["diagnosis"] is not None
    # the publication's CPU time: the publisher's, plus the forked exporter's (fork mode)
    assert writer.stats["publish_cpu_seconds"] > 0
    assert partials(tmp_path) == [] and staged(writer) == []


def test_a_publisher_killed_mid_publication_is_one_line_and_the_next_trace_starts_a_new_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = make_writer(tmp_path, "inline", publish_wait="never")
    killed = writer.submit(export_large, "iter000001-000001", STEM)
    pid = kill_mid_publication(tmp_path)
    assert killed.outcome is not None and killed.outcome.result(60).error
    assert partials(tmp_path) == [] and staged(writer) == [], "its partial and staged files are removed"
    after = writer.submit(export, "iter000002-000002", STEM)
    assert after.outcome is not None and after.outcome.result(60).published
    assert publisher() != pid
    close(writer)
    assert errors(caplog) == [f"rank 0: trace {killed.trace_path} was not written: its publisher (pid {pid}) "
                              "was killed by SIGKILL; the next trace starts a new one"]
    assert published(tmp_path) == ["iter000002-000002/rank00000_host_pid1.pt.trace.json.gz",
                                   "iter000002-000002/summaries/rank00000_host_pid1.operator_table.txt",
                                   "iter000002-000002/summaries/rank00000_host_pid1.summary.json"]
    assert staged(writer) == [] and writer.stats["publish_failures"] == 1
    assert writer.progress.row(0)[3] == 1, "the exit's line counts it as failed"


def test_a_flush_that_waits_returns_with_its_trace_published(tmp_path: Path) -> None:
    """--torch-profile-publish-wait always: the forked export and the publication are done when submit
    returns (on a busy node, 'auto' does this)."""
    writer = make_writer(tmp_path, "fork", publish_wait="always", publish_wait_timeout=60.0)
    outcome = writer.submit(export, "iter000001-000001", STEM)
    assert outcome.route is Route.FORKED and writer.in_flight == 0
    assert writer.stats["traces_written"] == 1 and writer.stats["publications_waited_for"] == 1
    assert outcome.trace_path and Path(outcome.trace_path).is_file() and staged(writer) == []
    close(writer)


def test_a_wait_ends_at_its_timeout_and_the_publication_goes_on(tmp_path: Path) -> None:
    writer = make_writer(tmp_path, "inline", publish_wait="always", publish_wait_timeout=0.05)
    outcome = writer.submit(export_large, "iter000001-000001", STEM)
    assert writer.in_flight == 1 and writer.stats["publication_waits_timed_out"] == 1
    close(writer)
    assert writer.stats["traces_written"] == 1 and outcome.trace_path and Path(outcome.trace_path).is_file()
    assert staged(writer) == []


def test_a_publisher_killed_while_the_flush_waits_ends_the_wait(tmp_path: Path, caplog) -> None:
    writer = make_writer(tmp_path, "inline", publish_wait="always", publish_wait_timeout=120.0)
    killed: list[int] = []
    killer = threading.Thread(target=lambda: killed.append(kill_mid_publication(tmp_path)))
    killer.start()
    started = time.monotonic()
    outcome = writer.submit(export_large, "iter000001-000001", STEM)
    waited = time.monotonic() - started
    killer.join()
    assert killed and waited < 60 and writer.in_flight == 0, waited
    assert errors(caplog) == [f"rank 0: trace {outcome.trace_path} was not written: its publisher "
                              f"(pid {killed[0]}) was killed by SIGKILL; the next trace starts a new one"]
    close(writer)
    assert published(tmp_path) == [] and staged(writer) == [] and writer.stats["publish_failures"] == 1


def test_a_publisher_that_does_not_answer_fails_its_trace_at_the_flush_timeout(tmp_path: Path,
                                                                              caplog) -> None:
    """Frozen (SIGSTOP) before the trace reaches it: the trace fails when the flush timeout is up, the
    publisher is stopped, and the next trace goes to a new one."""
    # 8 s: the forked export itself must finish within it (with two busy loops on this 2-core host
    # it once took over 3 s, and the trace failed as an export, not as a publication)
    writer = make_writer(tmp_path, "fork", flush_timeout=8.0, publish_wait="never")
    pid = publisher()
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = writer.submit(export, "iter000001-000001", STEM)
        assert frozen.outcome is not None and frozen.outcome.result(30).error
    finally:
        with contextlib.suppress(ProcessLookupError):  # stopped for good meanwhile
            os.kill(pid, signal.SIGCONT)
    after = writer.submit(export, "iter000002-000002", STEM)
    assert after.outcome is not None and after.outcome.result(60).published
    close(writer)
    assert errors(caplog) == [
        f"rank 0: trace {frozen.trace_path} was not written: not published within "
        "--torch-profile-flush-timeout (8 s): its publisher was stopped, the next trace starts a new one"]
    assert not running(pid)
    assert after.trace_path and Path(after.trace_path).is_file() and staged(writer) == []
    assert partials(tmp_path) == []


@pytest.mark.skipif(not faults.can_limit_forks(), reason="needs a pids cgroup (root) or RLIMIT_NPROC")
def test_traces_no_publisher_can_start_for_are_not_published_in_the_training_process(tmp_path: Path,
                                                                                    caplog) -> None:
    """The publisher died and no process can start (EAGAIN): each trace is logged with the rank and the
    reason and its staged files are removed; publishing never runs on the training thread."""
    writer = make_writer(tmp_path, "inline", publish_wait="never")
    pid = publisher()
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: any("the publisher (pid" in e for e in errors(caplog)))
    with faults.ForkLimit():
        outcomes = [writer.submit(export, f"iter00000{i}-00000{i}", STEM) for i in (1, 2)]
        assert all(o.route is Route.INLINE and o.outcome is not None for o in outcomes)
        statuses = [o.outcome.result(30) for o in outcomes if o.outcome is not None]
    assert all(not status.published for status in statuses)
    close(writer)
    assert errors(caplog) == [
        f"rank 0: the publisher (pid {pid}) was killed by SIGKILL; the next trace starts a new one",
        *(f"rank 0: trace {o.trace_path} was not written: no publisher could be started (Resource "
          "temporarily unavailable); it is not published in the training process" for o in outcomes)]
    assert published(tmp_path) == [] and staged(writer) == [] and writer.stats["publish_failures"] == 2


def test_a_job_outside_the_publisher_s_directories_is_rejected(tmp_path: Path) -> None:
    staging, output = tmp_path / "staging", tmp_path / "out"
    staging.mkdir(mode=0o700)
    output.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    process = PublisherProcess.start([str(staging)], str(output), "normal")
    try:
        process.send(PublishJob(str(victim), str(output / "r.pt.trace.json.gz")))
        answers: list = []
        assert wait_until(lambda: bool(answers.extend(process.replies() or []) or answers), 60)
    finally:
        process.close()
    (status,) = answers
    assert "publisher rejected the job" in (status.error or "") and "victim.txt" in status.error
    assert victim.read_text() == "keep me" and list(output.iterdir()) == []
    assert process.popen.returncode == 0, "it exits at the end of its input"


_TRAINER = """
import os, sys, time
from pathlib import Path
from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export.staging import StagingArea
from torchprof_args.capture.runtime.export.writer import TraceWriter
staging = StagingArea(sys.argv[1]); staging.open()
writer = TraceWriter(sys.argv[2], staging, ExportConfig(), rank=0)
if sys.argv[3] == "fork" and os.fork() == 0:  # a forked child (a data loader's) holds the publisher's input
    time.sleep(600)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("child", ["alone", "fork"], ids=["alone", "with a forked child"])
def test_the_publisher_exits_when_the_training_process_is_killed(tmp_path: Path, child: str) -> None:
    argv = [sys.executable, "-c", _TRAINER, str(tmp_path / "staging"), str(tmp_path / "out"), child]
    (tmp_path / "tmp").mkdir()  # its staging fallback: a killed trainer's is swept by the next job's
    trainer = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                               env={**publisher_env(), "TMPDIR": str(tmp_path / "tmp")})
    try:
        assert trainer.stdout is not None and trainer.stdout.readline() == "ready\n"
        pid = publisher_of(trainer.pid)
        others = [c for c in faults.children(trainer.pid) if c != pid]
    finally:
        trainer.kill()
        trainer.wait()
    try:
        assert wait_until(lambda: not running(pid), 10), "the publisher outlived the training process"
    finally:
        for other in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(other, signal.SIGKILL)


def publisher_of(trainer: int) -> int:
    assert wait_until(lambda: len(faults.publishers_of(trainer)) == 1)
    return faults.publishers_of(trainer)[0]
