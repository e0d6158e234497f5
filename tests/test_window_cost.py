"""What a profiled window costs training, and keeping it small: the exporter and the publisher at the
lowest CPU and I/O priority (a real fork, a real publisher process), back to SCHED_OTHER at exit, and
the profiler's running account of its own cost."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers.publishing import served

from torchprof_args.capture.runtime.cost import ProfilingCost
from torchprof_args.capture.runtime.export.child import fork_export
from torchprof_args.capture.runtime.export.job import PublishJob
from torchprof_args.capture.runtime.export.priority import (
    IOPRIO_CLASS_BE,
    IOPRIO_CLASS_IDLE,
    io_priority,
    leave_idle_policy,
    lower_to_background,
)
from torchprof_args.capture.runtime.export.publisher import PublisherProcess

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE and ioprio are Linux's")

def _priority(pid: int = 0) -> dict:
    return {
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "idle": os.sched_getscheduler(pid) == os.SCHED_IDLE,
        "io": list(io_priority(pid) or ()),
    }


def _seen(tmp_path: Path, priority: str) -> tuple[dict, dict]:
    """What the forked exporter and the rank's publisher process run at."""
    job = PublishJob(staged_path=str(tmp_path / "staged.json"), trace_path=str(tmp_path / "out.json.gz"))

    def export(path: str) -> None:  # the child: its own priority, as a complete "trace"
        Path(path).write_text(json.dumps(_priority()))

    exporter = fork_export(export, job, str(tmp_path / "job.json"), background=priority == "idle")
    ended = exporter.reap(block=True)
    exporter.close()
    assert ended is not None and ended[0] == 0
    process = PublisherProcess.start([str(tmp_path)], str(tmp_path), priority)
    try:
        if priority == "idle":  # lowered first thing
            deadline = time.monotonic() + 30
            while os.getpriority(os.PRIO_PROCESS, process.pid) != 19 and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            time.sleep(0.5)
        seen = _priority(process.pid)
    finally:
        process.close()
    return json.loads(Path(job.staged_path).read_text()), seen


@pytest.mark.slow
@linux
def test_the_forked_exporter_and_the_publisher_run_at_the_lowest_priority(tmp_path: Path) -> None:
    before = _priority()
    exporter, publisher = _seen(tmp_path, "idle")
    for seen in (exporter, publisher):
        assert seen["nice"] == 19 and seen["idle"] is True
        assert list(seen["io"]) == [IOPRIO_CLASS_IDLE, 0]
    assert _priority() == before  # the training process keeps its own


@pytest.mark.slow
@linux
def test_normal_priority_keeps_the_training_process_priority(tmp_path: Path) -> None:
    exporter, publisher = _seen(tmp_path, "normal")
    own = _priority()
    assert (
        exporter["nice"] == publisher["nice"] == own["nice"]
        and not exporter["idle"]
        and not publisher["idle"]
    )


@linux
def test_at_exit_a_publisher_leaves_sched_idle_but_stays_at_nice_19() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "publisher": lowers itself, says so, waits to be looked at
        os.close(read)
        lower_to_background()
        os.write(write, b"x")
        time.sleep(30)
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"x"
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE and io_priority(pid)[0] == IOPRIO_CLASS_IDLE
        leave_idle_policy(pid)
        assert os.sched_getscheduler(pid) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, pid) == 19
        assert io_priority(pid) == (IOPRIO_CLASS_BE, 7)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)



@linux
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged user")
def test_an_unprivileged_trainer_cannot_move_its_publisher_out_of_sched_idle_and_goes_on() -> None:
    """What the docs say: Linux lets an unprivileged process (RLIMIT_NICE 0, the usual limit) enter
    SCHED_IDLE but not leave it; leave_idle_policy is then refused quietly."""
    read, write = os.pipe()
    trainer = os.fork()
    if trainer == 0:
        code = 1
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            publisher = os.fork()
            if publisher == 0:
                lower_to_background()
                time.sleep(30)
                os._exit(0)
            time.sleep(0.2)  # the publisher has lowered itself
            leave_idle_policy(publisher)  # refused: must not raise
            still_idle = os.sched_getscheduler(publisher) == os.SCHED_IDLE
            os.kill(publisher, signal.SIGKILL)
            os.waitpid(publisher, 0)
            os.write(write, b"idle" if still_idle else b"left")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        assert os.read(read, 4) == b"idle"
    finally:
        _, status = os.waitpid(trainer, 0)
        os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0

class _Writer:
    def __init__(self, in_flight: int) -> None:
        self.in_flight = in_flight


def test_cost_clock_stalls_and_extra_time_over_the_quiet_pace() -> None:
    cost = ProfilingCost()
    cost.arrive(1, now=0.0)  # no mark yet: nothing measured
    cost.resume(1, recording=True, writer=None, now=0.0)
    cost.arrive(2, now=0.15)  # a recorded step before any quiet one: waits for the baseline
    cost.resume(2, recording=False, writer=_Writer(0), now=0.15)
    cost.stall("flush", 0.5)
    cost.arrive(12, now=1.15)  # 10 quiet steps of 0.1 s: the baseline
    assert cost.baseline == pytest.approx(0.1)
    assert cost.resume(12, recording=False, writer=_Writer(1), now=1.20) is True  # a publisher runs
    cost.arrive(13, now=1.33)
    cost.stall("memory snapshot", 0.25)
    figures = cost.figures()
    assert figures["recording_extra_seconds_total"] == pytest.approx(0.05)
    assert figures["publishing_extra_seconds_total"] == pytest.approx(0.03)
    assert figures["flush_seconds_total"] == 0.5 and figures["snapshot_seconds_total"] == 0.25
    assert figures["cost_seconds_total"] == pytest.approx(0.5 + 0.25 + 0.05 + 0.03)
    assert cost.last_stall == 0.25


def test_the_publisher_run_in_process_leaves_its_caller_s_priority_alone(tmp_path: Path) -> None:
    """Only a publisher process started with ``--priority idle`` (what the writer passes) lowers itself:
    its loop run in process (tests, tools) must not leave its caller at SCHED_IDLE."""
    before = _priority()
    staging, output = tmp_path / "staging", tmp_path / "out"
    staging.mkdir()
    output.mkdir()
    job = PublishJob(str(staging / "missing.json"), str(output / "r.pt.trace.json.gz"))
    (status,) = served(staging, output, job)
    assert status.error and "missing.json" in status.error
    assert _priority() == before
