"""``--torch-profile-publish-wait``: the node's idle cores since the last flush (``/proc/stat`` over
the CPUs this process may use, or a cgroup v2 CPU quota less the cgroup's own use) and the writer's
choice from them, on prepared ``/proc`` trees and on this machine's; the flags' checks.

The waits themselves on real processes: tests/test_publisher.py (a trace published when submit
returns, a wait ended by its timeout, the publisher killed mid-wait), tests/test_faults.py (a real 2-rank
job's publisher killed while its flush step waits); the cost on a real job:
benchmarks/bench_window_cost.py."""

from __future__ import annotations

import argparse
import gzip
import os
import threading
import time
from pathlib import Path

import pytest
from helpers.paths import DATA

from torchprof_args import TorchProfileArgsError, add_torch_profile_args, configs_from_args
from torchprof_args.capture.runtime.config import ExportConfig
from torchprof_args.capture.runtime.export.idle_cpu import IdleCpuProbe
from torchprof_args.capture.runtime.export.staging import StagingArea
from torchprof_args.capture.runtime.export.writer import TraceWriter

CPUS = sorted(os.sched_getaffinity(0))
REAL_TRACE = gzip.decompress((DATA / "cpu_2rank_gloo_rank0_iter3.json.gz").read_bytes())


def _proc(tmp_path: Path, cgroup: str = "0::/\n", mounts: str = "") -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mounts)
    return proc


def _stat(proc: Path, idle: int, busy: int, extra_cpu: bool = True) -> None:
    """Every usable CPU with ``idle`` idle and ``busy`` user ticks (and a CPU this process may not use,
    fully idle, which must not count)."""
    lines = [f"cpu  {busy * len(CPUS)} 0 0 {idle * len(CPUS)} 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy} 0 0 {idle} 0 0 0 0 0 0" for n in CPUS]
    if extra_cpu:
        lines.append(f"cpu{max(CPUS) + 1} 0 0 0 {idle + busy} 0 0 0 0 0 0")
    (proc / "stat").write_text("\n".join(lines) + "\nintr 1 2 3\n")


def test_idle_cores_from_proc_stat_count_only_the_usable_cpus(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    _stat(proc, idle=1000, busy=1000)
    probe = IdleCpuProbe(proc)
    assert probe.source == "/proc/stat" and probe.idle_cores() is None  # no mark yet
    probe.mark()
    _stat(proc, idle=1000 + 25, busy=1000 + 75)  # a quarter of each CPU idle since the mark
    assert probe.idle_cores() == pytest.approx(0.25 * len(CPUS))



def test_an_unreadable_or_malformed_proc_stat_gives_no_figure(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    probe = IdleCpuProbe(proc)  # no stat file at all
    probe.mark()
    assert probe.idle_cores() is None
    (proc / "stat").write_text("".join(f"cpu{n} 1 2 x\n" for n in CPUS))
    probe.mark()
    assert probe.idle_cores() is None


def test_idle_cores_under_a_cgroup_v2_quota_are_the_quota_less_the_job_s_use(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    job = root / "job.slice" / "rank0"
    job.mkdir(parents=True)
    (root / "job.slice" / "cpu.max").write_text("150000 100000\n")  # 1.5 cores for the job
    (root / "job.slice" / "cpu.stat").write_text("usage_usec 5000000\nuser_usec 1\n")
    (job / "cpu.max").write_text("max 100000\n")
    proc = _proc(tmp_path, "0::/job.slice/rank0\n", f"30 25 0:27 / {root} rw - cgroup2 cgroup2 rw\n")
    _stat(proc, idle=1000, busy=0)  # the host: idle (other tenants' cores are not the job's)
    probe = IdleCpuProbe(proc)
    if len(CPUS) <= 1.5:
        pytest.skip("a quota of 1.5 cores limits nothing on a 1-CPU machine")
    assert "job.slice" in probe.source
    probe.mark()
    started = time.monotonic()
    time.sleep(0.2)
    (root / "job.slice" / "cpu.stat").write_text("usage_usec 5250000\n")  # 0.25 s of CPU
    idle = probe.idle_cores()
    wall = time.monotonic() - started
    assert idle == pytest.approx(1.5 - 0.25 / wall, abs=0.15)


def test_idle_cores_on_this_machine_drop_while_a_thread_spins() -> None:
    probe = IdleCpuProbe()
    probe.mark()
    stop = time.monotonic() + 0.5
    while time.monotonic() < stop:
        pass
    idle = probe.idle_cores()
    assert idle is not None and 0.0 <= idle <= len(CPUS) - 0.5


def _writer(tmp_path: Path, probe: IdleCpuProbe, wait: str = "auto") -> TraceWriter:
    staging = StagingArea(str(tmp_path / "staging"))
    staging.open()
    config = ExportConfig(mode="inline", publish_wait=wait, publish_wait_timeout=60.0)
    return TraceWriter(tmp_path / "out", staging, config, rank=0, idle_cpu=probe)


@pytest.mark.slow
@pytest.mark.parametrize("idle_share", [0.05, 1.0], ids=["busy node", "idle node"])
def test_auto_waits_for_the_publication_only_on_a_busy_node(tmp_path: Path, idle_share: float,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one publisher on the node: it needs one idle core
    proc = _proc(tmp_path)
    _stat(proc, idle=100, busy=100)
    writer = _writer(tmp_path, IdleCpuProbe(proc))
    # since the writer started: idle_share of every CPU idle (a busy node: less than one core)
    _stat(proc, idle=100 + int(1000 * idle_share), busy=100 + int(1000 * (1 - idle_share)))
    busy = idle_share * len(CPUS) < 1
    outcome = writer.submit(lambda path: Path(path).write_bytes(REAL_TRACE), "iter000001-000001",
                            "rank00000_host_pid1")
    assert writer.stats["publications_waited_for"] == (1 if busy else 0)
    if busy:
        assert writer.in_flight == 0 and outcome.trace_path and Path(outcome.trace_path).is_file()
    writer.close(time.monotonic() + 60, "the test's deadline")
    assert outcome.trace_path and Path(outcome.trace_path).is_file()


def test_never_does_not_read_the_cpu_figures(tmp_path: Path) -> None:
    """``never`` (and ``always``) decide without the probe: nothing is read at the flush."""
    calls = threading.Event()

    class Probe(IdleCpuProbe):
        def mark(self) -> None:
            calls.set()

    writer = _writer(tmp_path, Probe(_proc(tmp_path)), wait="never")
    writer.close(time.monotonic() + 5, "the test's deadline")
    assert not calls.is_set()


def _parse(*argv: str) -> argparse.Namespace:
    return add_torch_profile_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_the_flags_and_their_checks(tmp_path: Path) -> None:
    flags = ("--torch-profile", "--torch-profile-dir", str(tmp_path))
    export = configs_from_args(_parse(*flags)).profiler.export
    assert (export.publish_wait, export.publish_wait_timeout) == ("auto", 1.0)
    export = configs_from_args(_parse("--torch-profile", "--torch-profile-dir", str(tmp_path),
                                      "--torch-profile-publish-wait", "never",
                                      "--torch-profile-publish-wait-timeout", "2.5")).profiler.export
    assert (export.publish_wait, export.publish_wait_timeout) == ("never", 2.5)
    with pytest.raises(TorchProfileArgsError, match=r"--torch-profile-publish-wait-timeout \(60 s\) must be "
                                                    r"shorter than --torch-profile-flush-timeout \(30 s\)"):
        configs_from_args(_parse("--torch-profile", "--torch-profile-dir", str(tmp_path),
                                 "--torch-profile-flush-timeout", "30", "--torch-profile-exit-timeout", "10",
                                 "--torch-profile-publish-wait-timeout", "60"))
    for bad in (("--torch-profile-publish-wait", "sometimes"), ("--torch-profile-publish-wait-timeout", "0")):
        with pytest.raises(SystemExit):
            _parse(*bad)
