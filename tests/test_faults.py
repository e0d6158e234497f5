"""The fault-injection suite: real 2-rank torchrun/gloo jobs with real torch.profiler and real faults
(small tmpfs mounts for full or read-only filesystems, a pids cgroup or RLIMIT_NPROC for fork
failures, real signals).  Several faults share a job where the checks stay clear.

Every job: the ranks train to the end (or refuse to start with a one-line error, or end by
SIGTERM when that is the fault), each failure is logged with the rank and the reason, nothing
half-written is visible under the output directory, the staging directories are gone, and no
publisher outlives the job.  ``benchmarks/bench_faults.py`` runs each fault on its own.
"""

from __future__ import annotations

import pytest
from helpers import faults
from helpers.fault_scenarios import FAULTS, HEAVY, Outcome, Scenario, run, trace_steps

pytestmark = pytest.mark.slow

needs_mount = pytest.mark.skipif(not faults.can_mount(), reason="needs root to mount small tmpfs filesystems")
FAULT = {scenario.name: scenario for scenario in FAULTS}


def assert_clean(outcome: Outcome) -> None:
    context = outcome.output[-4000:]
    assert not outcome.crashed, context
    assert outcome.survived, context
    assert outcome.partials == [], outcome.partials
    assert outcome.leftovers == [], outcome.leftovers
    assert outcome.orphans == [], outcome.orphans
    assert outcome.bad_traces == [], outcome.bad_traces


def names(outcome: Outcome, rank: int) -> list[str]:
    return sorted(t.name for t in outcome.traces if t.name.startswith(f"rank{rank:05d}_"))


def one_line(text: str, *words: str) -> list[str]:
    return [line for line in text.splitlines() if all(word in line for word in words)]


def test_refuses_to_start_on_an_unwritable_output_directory(tmp_path):
    outcome = run(FAULT["output dir unwritable from the start"], tmp_path)
    assert_clean(outcome)
    reason = "Read-only file system" if faults.can_mount() else "Permission denied"
    # Each rank, before training (counted, not by line: torchrun's shared pipe can join two ranks'
    # lines when they print at the same moment).
    error = f"fault_job.py: error: --torch-profile-dir '{tmp_path / 'out'}' is not writable ({reason})"
    assert outcome.output.count(error) == 2, outcome.output[-3000:]
    assert outcome.results == {}


def test_refuses_to_start_on_every_rank_when_one_ranks_staging_is_unsafe(tmp_path):
    outcome = run(FAULT["staging dir group-writable on one rank"], tmp_path)
    assert_clean(outcome)
    errors = one_line(outcome.output, "fault_job.py: error: rank 1: --torch-profile-staging-dir",
                      "group- or world-writable (mode 777)")
    assert len(errors) == 2, outcome.output[-3000:]  # rank 0 refuses too: start() agrees
    assert outcome.results == {}


def test_export_faults_failed_export_full_staging_and_failed_fork(tmp_path):
    """Rank 0 forks, rank 1 exports inline; cycle 1: the export raises after writing half a file;
    cycle 2: the staging tmpfs fills up during the export (Kineto only logs and leaves .tmp);
    cycle 3: fork (and starting a process or a thread) fails with EAGAIN: rank 0 exports inline, and
    both ranks' traces go to the publisher and the publications thread started with the writer;
    cycle 4: normal.  Without root, cycle 2 runs normally (no tmpfs).  The deprecated
    --no-torch-profile-publisher-server still parses, with one warning per rank."""
    full_staging, fork_limit = faults.can_mount(), faults.can_limit_forks()
    args = ["--torch-profile-ranks", "all", "--rank-export", "1=inline", "--torch-profile-repeat", "4",
            "--torch-profile-max-publishing", "0",  # every cycle, however slow the publishers
            "--no-torch-profile-publisher-server"]
    expected = {3: "RuntimeError: injected export failure", 5: None, 7: None, 9: None}
    for rank in (0, 1):
        args += ["--inject", f"{rank}:1:raise"]
        if full_staging:
            args += ["--inject", f"{rank}:2:fill-staging"]
        if fork_limit:
            args += ["--inject", f"{rank}:3:fork-limit"]
    if full_staging:  # a tmpfs per rank: one rank's filler must not decide where the other stages
        args += ["--torch-profile-staging-dir", "{stage}", "--rank-staging", "1={stage1}"]
        expected[5] = "ExportIncomplete: the exporter wrote no trace file"
    mounts = (("stage", "256m", False), ("stage1", "256m", False)) if full_staging else ()
    scenario = Scenario("export faults", args, mounts=mounts, iters=10)
    outcome = run(scenario, tmp_path)
    assert_clean(outcome)
    for rank in (0, 1):
        errors = outcome.errors(rank)
        failed = {it: why for it, why in expected.items() if why}
        assert len(errors) == len(failed), "\n".join(outcome.logs[rank])  # every line, for a diagnosis
        for error, (iteration, why) in zip(errors, sorted(failed.items()), strict=True):
            assert (f"rank {rank}:" in error and f"iter{iteration:06d}-{iteration:06d}" in error
                    and why in error)
        published = sorted(t.parent.name[len("iter"):][:6] for t in outcome.traces
                           if t.name.startswith(f"rank{rank:05d}_"))
        assert published == [f"{it:06d}" for it, why in sorted(expected.items()) if not why]
        log = "\n".join(outcome.logs[rank])
        if full_staging:
            assert "full?" in errors[1]  # the reason names the full staging filesystem
            assert len(one_line(log, f"rank {rank}: trace", "it has less free than the estimated")) == 2
        assert len(one_line(log, "WARNING", f"rank {rank}: --torch-profile-publisher-server is deprecated "
                                            "and does nothing")) == 1
        assert not one_line(log, "no publisher could be started")
    if fork_limit:
        assert one_line("\n".join(outcome.logs[0]), "rank 0: fork failed (Resource temporarily unavailable)")


@needs_mount
@pytest.mark.parametrize("wait", ["always", "never"])
def test_output_faults_killed_publisher_full_and_read_only_output(tmp_path, wait):
    """Rank 0's publisher is SIGKILLed with its partial file in the output directory (cycle 1), the
    output filesystem is full (cycle 2), then remounted read-only (cycle 3); while the flush step
    waits for the publication (``always``: what ``auto`` does on a busy node) and while it runs in
    the background."""
    scenario = Scenario("output faults",
                        [*HEAVY, "--kill-publisher", "0", "--torch-profile-repeat", "3",
                         "--torch-profile-publish-wait", wait,
                         "--output-fs", "{out}", "--at", "5:drain", "--at", "5:fill-output",
                         "--at", "8:drain", "--at", "8:unfill-output", "--at", "8:remount-ro"],
                        mounts=(("out", "64m", False),), iters=11)
    outcome = run(scenario, tmp_path)
    assert_clean(outcome)
    assert outcome.results[0]["killed_mid_publish"] is True
    errors = outcome.errors(0)
    assert len(errors) == 3, outcome.logs[0]
    assert ("rank 0:" in errors[0] and "iter000003-000004" in errors[0]
            and "was killed by SIGKILL" in errors[0])
    assert "iter000006-000007" in errors[1] and "No space left on device" in errors[1]
    assert "iter000009-000010" in errors[2] and "Read-only file system" in errors[2]
    assert outcome.traces == [] and outcome.errors(1) == []
    stats = outcome.results[0]["stats"]
    waits = stats["publications_waited_for"] + stats["publication_waits_timed_out"]
    assert waits == (3 if wait == "always" else 0), stats


def test_a_trace_published_without_its_summary_sidecar_is_counted_at_exit(tmp_path):
    """The publisher publishes the trace but cannot write its sidecar: the rank warns with the reason,
    and rank 0's exit line counts it (it used to say ``none failed``)."""
    outcome = run(FAULT["summary sidecar unwritable"], tmp_path)
    assert_clean(outcome)
    assert [t.parent.name for t in outcome.traces] == ["iter000003-000003"]
    log = "\n".join(outcome.logs[0])
    assert len(one_line(log, "WARNING", "rank 0: summary error for", "iter000003-000003")) == 1, log
    exit_line = one_line(log, "WARNING", "rank 0: at exit: 1 trace(s) published")
    assert len(exit_line) == 1 and ("none failed; 1 published without their summary sidecar (rank(s) 0: see "
                                    "their warnings; the tools parse those traces)") in exit_line[0], log


def test_sigterm_mid_flush_is_acted_on_at_the_end_of_the_flush_and_delivered(tmp_path):
    """Rank 0 (fork) gets SIGTERM inside torch.profiler's trace-ready callback, rank 1 (inline)
    inside its export: no crash, publishers finished or stopped, SIGTERM delivered."""
    scenario = Scenario("sigterm mid-flush",
                        ["--torch-profile-ranks", "all", "--rank-export", "1=inline",
                         "--inject", "0:1:sigterm-in-flush", "--inject", "1:1:sigterm-in-export"],
                        expect="sigterm")
    outcome = run(scenario, tmp_path)
    assert_clean(outcome)
    assert outcome.output.count("exitcode  : -15") == 2 and "Segmentation fault" not in outcome.output
    for rank in (0, 1):
        log = "\n".join(outcome.logs[rank])
        assert one_line(log, f"rank {rank}: SIGTERM received; stopping profiling after iteration 3")
        assert one_line(log, f"rank {rank}: profiling cleaned up", "delivering it to the default action")
        assert (tmp_path / "res" / f"sigterm{rank}.json").exists()  # the SIGTERM hook ran
    assert outcome.results == {}


def test_sigterm_to_a_rank_blocked_in_the_fence_barrier(tmp_path):
    """Rank 1 dumps a 30 s memory snapshot; rank 0 waits in the gloo barrier (C code, no Python
    handler runs) and gets SIGTERM: the watchdog ends it after --torch-profile-term-grace (3 s);
    torchrun then stops rank 1, whose handler waits in a sleep: the watchdog ends it too."""
    outcome = run(FAULT["SIGTERM to a rank blocked at the fence"], tmp_path)
    assert_clean(outcome)
    for rank in (0, 1):
        assert one_line("\n".join(outcome.logs[rank]), f"rank {rank}: no safe point within "
                        "--torch-profile-term-grace (3 s) after SIGTERM")
    assert not one_line("\n".join(outcome.logs[1]), "written in 30")  # rank 0 did not wait for the dump


def test_slow_snapshot_and_low_host_memory_with_a_short_collective_timeout(tmp_path):
    """PG timeout 2 s.  Rank 0's snapshots take 4 s (at the window's end and at the interval
    iteration 5): fenced, nobody times out.  --torch-profile-min-free-host-mb above what is free:
    the 4-step window ends at its second step on both ranks, exported inline to disk."""
    scenario = Scenario("snapshots and memory", [
        "--pg-timeout", "2", "--torch-profile-ranks", "all", "--torch-profile-active", "4",
        "--torch-profile-min-free-host-mb", "100000000", "--torch-profile-memory-snapshot",
        "--torch-profile-memory-snapshot-interval", "5", "--slow-snapshot", "0:4"])
    outcome = run(scenario, tmp_path)
    assert_clean(outcome)
    for rank in (0, 1):
        log = "\n".join(outcome.logs[rank])
        assert one_line(log,
                        f"rank {rank}: host memory below --torch-profile-min-free-host-mb (100000000 MB)",
                        "rank 0:", "rank 1:", "ending the window at iteration 4 instead of 6 on every rank")
        assert one_line(log, "exporting inline")
        (trace,) = names(outcome, rank)
        (path,) = [t for t in outcome.traces if t.name == trace]
        assert path.parent.name == "iter000003-000004"
    for trace in outcome.traces:
        assert trace_steps(trace)[:2] == [3, 4]
    snapshots = sorted(p.name for p in (tmp_path / "out" / "memory_snapshots").iterdir())
    assert [s.split("_iter")[1] for s in snapshots] == ["0000004.pickle", "0000005.pickle"]


def test_slow_publisher_at_exit_is_fenced(tmp_path):
    """Rank 0's publisher is frozen for 5 s at exit; PG timeout 2 s; both ranks do an all-reduce
    right after leaving the profiler.  Rank 1 waits at the exit fence instead of timing out."""
    outcome = run(FAULT["slow publisher at exit (PG timeout 2 s)"], tmp_path)
    assert_clean(outcome)
    assert outcome.results[0]["frozen"] == 1
    assert len(names(outcome, 0)) == 1
    assert outcome.results[1]["exit_seconds"] >= 4.0  # it waited for rank 0's publisher, at the fence


def test_slow_publishers_skip_the_same_windows_on_every_rank_and_bound_those_in_flight(tmp_path):
    """Rank 0's publishers are frozen 3 s each, a window every 2 steps, at most 1 publication in
    flight: windows are skipped on both ranks alike (rank 1 publishes fast), none of a rank's counts
    ever exceeds 1, rank 0 says once how far behind it is (per streak of skips), nothing is left.
    Publications in the background (``never``): a flush step that waits (``auto`` on this busy
    machine) would give the frozen publisher a second each time and skip fewer windows."""
    scenario = Scenario("backpressure", ["--torch-profile-ranks", "all", "--torch-profile-repeat", "0",
                                         "--torch-profile-wait", "1", "--torch-profile-warmup", "0",
                                         "--torch-profile-skip-first", "0",
                                         "--torch-profile-publish-wait", "never",
                                         "--torch-profile-max-publishing", "1", "--stop-publisher", "0:3"],
                        iters=16)
    outcome = run(scenario, tmp_path)
    assert_clean(outcome)
    cycles = {rank: sorted(t.parent.name for t in outcome.traces if t.name.startswith(f"rank{rank:05d}_"))
              for rank in (0, 1)}
    assert cycles[0] == cycles[1] and 1 <= len(cycles[0]) < 8, cycles  # 8 windows planned
    skipped = {rank: outcome.results[rank]["skipped"] for rank in (0, 1)}
    assert skipped[0] == skipped[1] == 8 - len(cycles[0]), skipped
    assert all(outcome.results[rank]["max_in_flight"] <= 1 for rank in (0, 1)), outcome.results
    behind = one_line("\n".join(outcome.logs[0]), "WARNING", "rank 0: publishing is behind: rank 0 has 1")
    # rank 0 warns once per streak of skipped windows and says when publishing caught up
    caught_up = one_line("\n".join(outcome.logs[0]), "INFO", "rank 0: publishing caught up")
    assert 1 <= len(behind) <= skipped[0], outcome.logs[0]
    assert len(caught_up) in (len(behind) - 1, len(behind)), outcome.logs[0]
    assert not one_line("\n".join(outcome.logs[1]), "publishing")
    assert outcome.errors(0) == outcome.errors(1) == []
    # quiet: rank 0's lines per cycle (the last one at exit) count every trace of both ranks once; no
    # line per trace
    lines = one_line("\n".join(outcome.logs[0]), "trace(s) published up to")
    counted = sum(int(line.split("trace(s)")[0].split()[-1]) for line in lines)
    assert counted == len(outcome.traces) and "slowest publisher rank 0" in lines[-1], outcome.logs[0]
    assert not any("trace written" in line for rank in (0, 1) for line in outcome.logs[rank])
