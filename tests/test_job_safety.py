"""Job-safety pieces in one process: host memory figures, the per-flush export plan, private and
swept staging, the publisher's job checks, its status on the pipe, the new flags, and SIGTERM with an
application handler or inside the forked exporter (real subprocesses)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
from helpers.processes import subprocess_env
from helpers.publishing import served

from torchprof_args import TorchProfileArgsError, add_torch_profile_args, configs_from_args
from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export.job import JobRejected, PublishJob
from torchprof_args.capture.runtime.export.plan import ExportPlanner
from torchprof_args.capture.runtime.export.staging import LOCK_NAME, StagingArea, sweep_stale
from torchprof_args.capture.runtime.export.status import (
    STATUS_LIMIT,
    PublishStatus,
    read_status,
    report_status,
)
from torchprof_args.capture.runtime.host_resources import (
    HostMemory,
    HostMemoryProbe,
    free_disk_bytes,
    is_ram_backed,
)


def parse(*argv: str) -> argparse.Namespace:
    return add_torch_profile_args(argparse.ArgumentParser()).parse_args(list(argv))


# -- host memory -----------------------------------------------------------------------------

def fake_proc(tmp_path: Path, cgroup: str, mounts: str, meminfo_kb: int) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mounts)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {meminfo_kb} kB\n")
    return proc


def test_cgroup_v2_limit_less_working_set_wins_over_memavailable(tmp_path):
    root = tmp_path / "cg"
    job = root / "job.slice" / "rank0"
    job.mkdir(parents=True)
    (root / "job.slice" / "memory.max").write_text(str(8 << 30) + "\n")
    (root / "job.slice" / "memory.current").write_text(str(7 << 30) + "\n")
    (root / "job.slice" / "memory.stat").write_text(f"anon 1\ninactive_file {512 << 20}\n")
    (job / "memory.max").write_text("max\n")
    mounts = f"30 25 0:27 / {root} rw - cgroup2 cgroup2 rw\n"
    probe = HostMemoryProbe(fake_proc(tmp_path, "0::/job.slice/rank0\n", mounts, meminfo_kb=64 << 20))
    free = probe.free()
    assert free.free_bytes == (8 << 30) - ((7 << 30) - (512 << 20))  # limit less the working set
    assert "cgroup v2" in free.source and "job.slice" in free.source


def test_without_a_limit_memavailable_answers(tmp_path):
    probe = HostMemoryProbe(fake_proc(tmp_path, "0::/\n", "", meminfo_kb=3 << 20))
    assert probe.free() == HostMemory(3 << 30, "MemAvailable")


def test_real_probe_and_tmpfs_detection():
    free = HostMemoryProbe().free()
    assert free.free_bytes > 0 and free.source
    if Path("/dev/shm").is_dir():
        assert is_ram_backed("/dev/shm")
    assert free_disk_bytes("/nonexistent/dir") == 0


# -- export plan -----------------------------------------------------------------------------

class FixedProbe(HostMemoryProbe):
    def __init__(self, free_bytes: int) -> None:
        self._free = free_bytes

    def free(self) -> HostMemory:
        return HostMemory(self._free, "test")


def test_plan_forks_into_ram_when_memory_allows_and_goes_inline_to_disk_when_not(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    staging = StagingArea(None)
    staging.open()
    try:
        if not any(staging.ram.values()):
            pytest.skip("no RAM-backed /dev/shm here")
        plenty = ExportPlanner("fork", staging, 2 << 30, probe=FixedProbe(1 << 40)).plan(steps=1)
        assert plenty.mode == "fork" and staging.ram[plenty.staging] and plenty.note is None
        short = ExportPlanner("fork", staging, 2 << 30, probe=FixedProbe(2 << 30)).plan(steps=1)
        assert short.mode == "inline" and not staging.ram[short.staging]
        assert short.staging.is_relative_to(tmp_path)
        assert "does not cover a forked exporter" in short.note and "exporting inline" in short.note
    finally:
        staging.close()
    assert not (tmp_path / f"torchprof-{os.getuid()}").exists()


def test_plan_divides_by_local_ranks_and_learns_trace_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    staging = StagingArea(str(tmp_path / "explicit"))
    staging.open()
    try:
        planner = ExportPlanner("inline", staging, 0, probe=FixedProbe(1 << 40))
        assert planner.local_ranks == 8
        assert planner.estimate(steps=2) == 2 * 64 * (1 << 20) * 3 // 2
        planner.learn(30 << 20, steps=3)
        assert planner.estimate(steps=2) == int(20 << 20) * 3 // 2
        assert planner.plan(steps=1).staging == staging.dirs[0]
    finally:
        staging.close()


# -- staging ---------------------------------------------------------------------------------

def test_staging_is_private_locked_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    staging = StagingArea(str(tmp_path / "stage"))
    staging.open()
    main = staging.dirs[0]
    assert main == tmp_path / "stage" / f"torchprof-{os.getuid()}" / f"pid{os.getpid()}"
    assert (main.stat().st_mode & 0o777) == 0o700 and (main.parent.stat().st_mode & 0o777) == 0o700
    assert (main / LOCK_NAME).exists() and staging.contains(main / "x.json")
    staging.close()
    assert not main.exists() and not main.parent.exists()


def test_unsafe_staging_is_refused_with_the_flag_named(tmp_path):
    user_dir = tmp_path / "stage" / f"torchprof-{os.getuid()}"
    user_dir.mkdir(parents=True)
    user_dir.chmod(0o775)
    with pytest.raises(TorchProfileArgsError,
                       match=r"--torch-profile-staging-dir .* group- or world-writable"):
        StagingArea(str(tmp_path / "stage")).open()
    user_dir.chmod(0o700)
    (tmp_path / "elsewhere").mkdir()
    user_dir.rmdir()
    user_dir.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TorchProfileArgsError, match="symbolic link"):
        StagingArea(str(tmp_path / "stage")).open()


def test_sweep_removes_dead_jobs_and_keeps_live_or_locked_ones(tmp_path):
    user_dir = tmp_path / f"torchprof-{os.getuid()}"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = user_dir / f"pid{dead.pid}"
    stale.mkdir(parents=True)
    (stale / "rank00000_x.pt.trace.json").write_text("{}")
    (stale / ".partial-rank00000_y.pt.trace.json.tmp").write_text("{")
    live = user_dir / f"pid{os.getppid()}"  # a live process of another job
    live.mkdir()
    # A dead trainer whose orphaned publisher still holds the lock: kept.
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        os.makedirs({str(user_dir / 'pid999999999')!r}, exist_ok=True)
        fd = os.open({str(user_dir / 'pid999999999' / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        print("locked", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        removed = sweep_stale(user_dir)
        assert removed == [stale]
        assert live.exists() and (user_dir / "pid999999999").exists()
    finally:
        holder.kill()
        holder.wait()
    assert sweep_stale(user_dir) == [user_dir / "pid999999999"]


# -- publisher -------------------------------------------------------------------------------

def make_job(tmp_path: Path) -> tuple[Path, Path, Path]:
    staging, output = tmp_path / "staging", tmp_path / "out"
    staging.mkdir(mode=0o700)
    output.mkdir()
    staged = staging / "r.pt.trace.json"
    staged.write_text('{"traceEvents": []}')
    return staging, output, staged


def test_publisher_publishes_a_valid_job_and_its_extra_files(tmp_path):
    staging, output, staged = make_job(tmp_path)
    extra = staging / "r.et.json"
    extra.write_text('{"nodes": []}')
    job = PublishJob(str(staged), str(output / "r.pt.trace.json.gz"), operator_table_path=None,
                     extra_files=[(str(extra), str(output / "cycle1" / "r.et.json.gz"), 6)])
    (status,) = served(staging, output, job)
    assert status.published and status.rank == 0
    assert status.extra_files == [str(output / "cycle1" / "r.et.json.gz")] and status.extra_errors == []
    assert status.raw_mb is not None and status.trace_mb is not None
    assert 0 <= (status.trace_seconds or 0) <= status.publish_seconds
    assert sorted(p.name for p in output.rglob("*") if p.is_file()) == ["r.et.json.gz", "r.pt.trace.json.gz"]
    assert list(staging.iterdir()) == []


@pytest.mark.parametrize("bad", ["staged outside", "trace outside", "traversal", "not a job"])
def test_publisher_rejects_jobs_reaching_outside_its_directories(tmp_path, bad):
    staging, output, staged = make_job(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    job = PublishJob(str(staged), str(output / "r.pt.trace.json.gz"), operator_table_path=None)
    if bad == "staged outside":
        job.staged_path = str(victim)
    elif bad == "trace outside":
        job.trace_path = str(victim)
    elif bad == "traversal":
        job.trace_path = str(output / ".." / "victim.txt")
    line = b'{"staged_path": 1}\n' if bad == "not a job" else job.encode()
    with pytest.raises(JobRejected):
        PublishJob.decode(line, [str(staging)], str(output))
    # then a valid job: one bad line costs that job only
    valid = PublishJob(str(staged), str(output / "r.pt.trace.json.gz"))
    (status, after) = served(staging, output, line, valid)
    assert not status.published and "publisher rejected the job" in status.error
    assert victim.read_text() == "keep me" and after.published
    assert [p.name for p in output.iterdir()] == ["r.pt.trace.json.gz"]


def test_a_job_file_writable_by_others_is_not_read(tmp_path):
    """A forked exporter hands its job back in a file in the private staging directory: one that is
    not a regular file of this user writable only by it is rejected."""
    staging, output, staged = make_job(tmp_path)
    job_path = staging / "r.job.json"
    PublishJob(str(staged), str(output / "r.pt.trace.json.gz")).save(job_path)
    assert (job_path.stat().st_mode & 0o777) == 0o600
    assert PublishJob.load(job_path, [str(staging)], str(output)).staged_path == str(staged)
    job_path.chmod(0o666)
    with pytest.raises(JobRejected, match="writable only by it"):
        PublishJob.load(job_path, [str(staging)], str(output))


def test_a_job_file_with_a_wrong_field_type_is_rejected(tmp_path):
    staging, output, staged = make_job(tmp_path)
    job_path = staging / "r.job.json"
    PublishJob(str(staged), str(output / "r.pt.trace.json.gz")).save(job_path)
    fields = json.loads(job_path.read_text())
    fields["extra_files"] = [[str(staging / "x"), str(output / "x")]]  # no gzip level
    job_path.write_text(json.dumps(fields))
    job_path.chmod(0o600)
    with pytest.raises(JobRejected, match=r"cannot be read: Expected `array` of length 3"):
        PublishJob.load(job_path, [str(staging)], str(output))


# -- the status pipe -------------------------------------------------------------------------


def test_the_status_round_trips_on_the_pipe_and_only_its_last_complete_line_counts():
    status = PublishStatus(trace_path="/out/iter1-2/r.pt.trace.json.gz", rank=3, raw_mb=10.0, trace_mb=1.0,
                           trace_seconds=0.5, publish_seconds=0.75, summary_error="ValueError: x",
                           extra_files=["/out/a"])
    read, write = os.pipe()
    os.write(write, b"not a status\n")
    report_status(write, PublishStatus(error="first"))
    report_status(write, status)
    os.write(write, b'{"rank": "three"}\n{"trace_path": "/out/cut')  # wrong type, then cut short
    os.close(write)
    assert read_status(read) == status
    os.close(read)
    assert json.loads(msgspec.json.encode(status)) == {  # the wire: what is not at its default
        "trace_path": "/out/iter1-2/r.pt.trace.json.gz", "rank": 3, "raw_mb": 10.0, "trace_mb": 1.0,
        "trace_seconds": 0.5, "publish_seconds": 0.75, "summary_error": "ValueError: x",
        "extra_files": ["/out/a"]}


@pytest.mark.parametrize("long", ["error", "extra_errors", "trace_path"])
def test_a_long_status_is_shortened_to_one_atomic_pipe_write(long):
    status = PublishStatus(trace_path="/out/t", rank=1, error="OSError: disk full", publish_seconds=2.0)
    if long == "error":
        status.error = "OSError: " + "x" * 10_000
    elif long == "extra_errors":
        status.error = None
        status.extra_errors = [f"/out/extra{i}: OSError: " + "y" * 2000 for i in range(20)]
    else:
        status.trace_path = "/out/" + "d" * 5000
    read, write = os.pipe()
    report_status(write, status)
    os.close(write)
    line = os.read(read, 65536)
    assert len(line) <= STATUS_LIMIT + 1 and line.endswith(b"\n")
    decoded = msgspec.json.decode(line, type=PublishStatus)
    assert decoded.rank == 1 and decoded.publish_seconds == 2.0
    assert decoded.published is (long == "extra_errors")
    if long == "error":
        assert decoded.error.startswith("OSError: xxx") and decoded.error.endswith("...")
    if long == "extra_errors":
        assert len(decoded.extra_errors) == 4 and decoded.extra_errors[-1] == "... and 17 more"


# -- flags -----------------------------------------------------------------------------------

def test_safety_flags_and_their_checks(tmp_path):
    export = configs_from_args(parse("--torch-profile", "--torch-profile-dir", str(tmp_path),
                                     "--torch-profile-term-grace", "7",
                                     "--torch-profile-min-free-host-mb", "0",
                                     "--torch-profile-exit-timeout", "0")).profiler.export
    assert (export.term_grace, export.min_free_host_mb, export.exit_timeout) == (7.0, 0, 0.0)
    assert ExportConfig().term_grace < 30 and ExportConfig().min_free_host_mb == 2048
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-exit-timeout .* must be shorter than "
                                                    "--torch-profile-flush-timeout"):
        configs_from_args(parse("--torch-profile", "--torch-profile-dir", str(tmp_path),
                                "--torch-profile-flush-timeout", "60"))
    with pytest.raises(SystemExit):
        parse("--torch-profile-term-grace", "0")


# -- SIGTERM in real processes ----------------------------------------------------------------

def run_job(tmp_path: Path, body: str, *flags: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import argparse, os, signal, sys, time, torch
        from torchprof_args import TorchProfiler, add_torch_profile_args
        args = add_torch_profile_args(argparse.ArgumentParser()).parse_args(
            ["--torch-profile", "--torch-profile-dir", {str(tmp_path / 'prof')!r},
             "--no-torch-profile-operator-table", *{list(flags)!r}])
        model = torch.nn.Linear(16, 16)
    """) + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=subprocess_env(TMPDIR=str(tmp_path)))


@pytest.mark.slow
def test_sigterm_with_an_application_handler_runs_it_and_training_goes_on(tmp_path):
    """Megatron-style: the application's own handler sets a flag; the profiler cleans up at the
    next step, hands the signal to that handler, and the loop finishes."""
    result = run_job(tmp_path, """
        got = []
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
        with TorchProfiler.from_args(args) as prof:
            for iteration in range(1, 8):
                model(torch.randn(4, 16)).sum().backward()
                if iteration == 5:
                    os.kill(os.getpid(), signal.SIGTERM)
                prof.step(iteration)
        print("got", got, "traces", len(prof.published_traces), "handler restored",
              signal.getsignal(signal.SIGTERM) is not None
              and signal.getsignal(signal.SIGTERM).__name__ == "<lambda>")
    """, "--torch-profile-repeat", "0", "--torch-profile-wait", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "got [15] traces 1 handler restored True" in result.stdout, result.stdout + result.stderr[-2000:]
    assert "delivering it to the application's handler" in result.stderr
    assert list((tmp_path / "prof").glob(".partial*")) == []
    assert not (tmp_path / f"torchprof-{os.getuid()}").exists()


@pytest.mark.slow
def test_forked_exporter_resets_signal_handlers_first(tmp_path):
    """SIGTERM sent to the forked exporter kills it (default action) instead of running the
    trainer's handler there; the trainer reports it and trains on."""
    result = run_job(tmp_path, """
        import torchprof_args.capture.runtime.export.writer as writer_module
        real_fork_export = writer_module.fork_export
        def fork_export(export, *rest, **kwargs):
            def export_and_die(path):
                os.kill(os.getpid(), signal.SIGTERM)
                export(path)
            return real_fork_export(export_and_die, *rest, **kwargs)
        writer_module.fork_export = fork_export
        with TorchProfiler.from_args(args) as prof:
            for iteration in range(1, 6):
                model(torch.randn(4, 16)).sum().backward()
                prof.step(iteration)
        print("done", prof.stats["publish_failures"])
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done 1" in result.stdout
    assert "was killed by SIGTERM" in result.stderr and "rank 0:" in result.stderr
    assert "SIGTERM received" not in result.stderr  # the trainer's handler never ran
