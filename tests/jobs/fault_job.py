"""A 2-rank gloo training job with real torch.profiler and injected faults (see tests/test_faults.py).

Every iteration ends with an all-reduce (gradient sync) under ``--pg-timeout``, so a rank that
profiling holds up longer than that kills the job unless the pause is fenced.  Faults:

* ``--inject RANK:CYCLE:FAULT``: at that rank's CYCLE-th trace submission. ``raise`` (the export
  writes half a file, then raises), ``fill-staging`` (the staging filesystem fills up just before
  the export), ``sigterm-in-flush`` (SIGTERM inside torch.profiler's trace-ready callback),
  ``sigterm-in-export`` (SIGTERM inside the export), ``fork-limit`` (fork fails with EAGAIN);
* ``--kill-publisher RANK``: SIGKILL the rank's publisher once its partial output file appears;
* ``--stop-publisher RANK:SECONDS``: freeze the rank's publisher that long at each trace it starts
  writing (a slow publisher);
* ``--at ITER:ACTION`` on rank 0: ``drain`` (wait for earlier publishers), ``fill-output`` /
  ``unfill-output`` / ``remount-ro`` of ``--output-fs``;
* ``--slow-snapshot RANK:SECONDS``: memory snapshots on RANK whose dump sleeps that long;
* ``--sigterm-in-fence RANK:SECONDS``: SIGTERM to RANK that long after it entered its first fence wait;
* ``--collective-after-exit``: an all-reduce right after leaving the profiler (the host's next collective).

Each rank writes ``--result-dir/started<R>.json`` (its pid), ``rank<R>.json`` when it finishes
(and ``sigterm<R>.json`` from the SIGTERM hook); its torchprof log lines go to ``log<R>.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from helpers import faults  # tests/ is on PYTHONPATH (helpers.processes.subprocess_env)

from torchprof_args import TorchProfileArgsError, TorchProfiler, add_torch_profile_args
from torchprof_args.atomic import PARTIAL_PREFIX, write_json_atomically
from torchprof_args.capture.config import configs_from_args
from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--result-dir", required=True)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--pg-timeout", type=float, default=60.0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rank-export", action="append", default=[], metavar="RANK=MODE")
    parser.add_argument("--rank-staging", action="append", default=[], metavar="RANK=DIR")
    parser.add_argument("--inject", action="append", default=[], metavar="RANK:CYCLE:FAULT")
    parser.add_argument("--fill-dir", help="where fill-staging writes its filler (default: the rank's "
                                           "--torch-profile-staging-dir, after --rank-staging)")
    parser.add_argument("--kill-publisher", type=int, action="append", default=[], metavar="RANK")
    parser.add_argument("--stop-publisher", action="append", default=[], metavar="RANK:SECONDS")
    parser.add_argument("--at", action="append", default=[], metavar="ITER:ACTION")
    parser.add_argument("--output-fs")
    parser.add_argument("--slow-snapshot", action="append", default=[], metavar="RANK:SECONDS")
    parser.add_argument("--sigterm-in-fence", action="append", default=[], metavar="RANK:SECONDS")
    parser.add_argument("--collective-after-exit", action="store_true")
    add_torch_profile_args(parser)
    return parser.parse_args()


class Records(logging.Handler):
    """The rank's torchprof log lines, kept for the result file and appended to log<R>.txt."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        line = f"{record.levelname} {record.getMessage()}"
        self.lines.append(line)
        with open(self.path, "a") as handle:
            handle.write(line + "\n")


def per_rank(entries: list[str], rank: int, parts: int) -> list[list[str]]:
    found = [entry.split(":", parts - 1) for entry in entries]
    return [entry[1:] for entry in found if int(entry[0]) == rank]


def injected_export(fault: str, real, fill_dir: str | None):
    def export(path: str) -> None:
        if fault == "raise":
            Path(path).write_text('{"traceEvents": [')
            raise RuntimeError("injected export failure")
        if fault == "fill-staging":
            faults.fill_filesystem(fill_dir)
        if fault == "sigterm-in-export":
            os.kill(os.getpid(), signal.SIGTERM)
        real(path)
    return export


def inject_submit_faults(prof: TorchProfiler, args: argparse.Namespace, rank: int, state: dict) -> None:
    writer = prof._writer  # noqa: SLF001 - fault injection into the real writer
    if writer is None:
        return
    plan = {int(cycle): fault for cycle, fault in per_rank(args.inject, rank, 3)}
    real_submit = writer.submit

    def submit(export, cycle, stem, steps=1, extra_files=(), companion=None):
        state["cycle"] += 1
        fault = plan.get(state["cycle"])
        if fault == "sigterm-in-flush":
            os.kill(os.getpid(), signal.SIGTERM)  # lands inside torch.profiler's transition
        if fault in ("raise", "fill-staging", "sigterm-in-export"):
            export = injected_export(fault, export, args.fill_dir or args.torch_profile_staging_dir)
        if fault == "fork-limit":
            with faults.ForkLimit():
                return real_submit(export, cycle, stem, steps, extra_files, companion=companion)
        return real_submit(export, cycle, stem, steps, extra_files, companion=companion)

    writer.submit = submit


def watch_publishers(prof: TorchProfiler, args: argparse.Namespace, rank: int, state: dict) -> None:
    """Threads that kill or freeze this rank's publisher."""
    stop_seconds = [float(s[0]) for s in per_rank(args.stop_publisher, rank, 2)]
    output = Path(args.torch_profile_dir)
    staging = list(prof._writer.staging.dirs) if prof._writer is not None else []  # noqa: SLF001

    def kill_mid_publish() -> None:
        """Freeze the publisher as soon as it runs, then let it on in 1 ms slices until its hidden
        partial file exists: SIGKILL it there, mid-publish."""
        while not (pids := faults.publishers_of()):
            time.sleep(0.0005)
        pid = pids[0]
        os.kill(pid, signal.SIGSTOP)
        while faults.cmdline(pid) and not any(output.rglob(".partial-*")):
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.001)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.001)
        state["killed_mid_publish"] = any(output.rglob(".partial-*"))
        os.kill(pid, signal.SIGKILL)

    def freeze() -> None:
        """At each trace staged for the publisher (until it is published), freeze the publisher.  A
        trace still under its hidden partial name (``glob`` matches it too) is not staged yet: on a
        busy host the poll sees both names, and one trace froze the publisher twice."""
        seen: set[str] = set()
        while True:
            for staged in (p for d in staging for p in d.glob("*.pt.trace.json")):
                if staged.name not in seen and not staged.name.startswith(PARTIAL_PREFIX):
                    seen.add(staged.name)
                    for pid in faults.publishers_of():
                        faults.stop_for(pid, stop_seconds[0])
                        state["frozen"] = state.get("frozen", 0) + 1
            time.sleep(0.002)

    if rank in args.kill_publisher:
        threading.Thread(target=kill_mid_publish, daemon=True).start()
    if stop_seconds:
        threading.Thread(target=freeze, daemon=True).start()


def build_profiler(args: argparse.Namespace, rank: int) -> TorchProfiler:
    for mode in (m for r, m in (e.split("=", 1) for e in args.rank_export) if int(r) == rank):
        args.torch_profile_export = mode
    for staging in (d for r, d in (e.split("=", 1) for e in args.rank_staging) if int(r) == rank):
        args.torch_profile_staging_dir = staging
    slow = per_rank(args.slow_snapshot, rank, 2)
    if not slow:
        return TorchProfiler.from_args(args)
    seconds = float(slow[0][0])

    def slow_dump() -> dict:
        time.sleep(seconds)  # stands in for a C++-stack snapshot of a real model
        return {"segments": [], "device_traces": [[]]}

    run = configs_from_args(args, world_size=dist.get_world_size())
    memory = MemorySnapshotter(run.profiler.memory, rank=rank, snapshot_fn=slow_dump,
                               record_fn=lambda **_: None, cuda_available=True)
    return TorchProfiler(run.profiler, rank=rank, world_size=dist.get_world_size(), memory=memory)


def at_iteration(args: argparse.Namespace, prof: TorchProfiler, rank: int, iteration: int) -> None:
    for when, action in (entry.split(":", 1) for entry in args.at):
        if int(when) != iteration or rank != 0:
            continue
        if action == "drain":  # let the publishers of earlier cycles finish first
            deadline = time.monotonic() + 60
            while prof._writer.in_flight and time.monotonic() < deadline:  # noqa: SLF001
                time.sleep(0.01)
        elif action == "fill-output":
            faults.fill_filesystem(args.output_fs, leave_bytes=4 << 10)
        elif action == "unfill-output":
            (Path(args.output_fs) / "filler").unlink()
        elif action == "remount-ro":
            faults.remount(args.output_fs, read_only=True)


def sigterm_in_fence(prof: TorchProfiler, seconds: float) -> None:
    """SIGTERM to this process while its main thread waits in the fence's gloo barrier (C code)."""
    while prof._fence.waits == 0:  # noqa: SLF001 - counted on entry, just before the barrier
        time.sleep(0.005)
    time.sleep(seconds)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    args = parse()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    results = Path(args.result_dir)
    results.mkdir(parents=True, exist_ok=True)
    records = Records(results / f"log{rank}.txt")
    logging.getLogger("torchprof_args").addHandler(records)
    write_json_atomically(results / f"started{rank}.json", {"rank": rank, "pid": os.getpid()})
    try:
        prof = build_profiler(args, rank)
        prof.start()
    except TorchProfileArgsError as err:
        print(f"fault_job.py: error: {err}", file=sys.stderr)
        # leave like a well-behaved job: gloo's threads ended, not torn down at exit
        dist.destroy_process_group()
        return 2
    state = {"cycle": 0}
    prof._sigterm.hooks.append(lambda: write_json_atomically(  # noqa: SLF001 - the documented hook point
        results / f"sigterm{rank}.json", {"rank": rank, "iteration": prof._iteration, "time": time.time()}))
    inject_submit_faults(prof, args, rank, state)
    watch_publishers(prof, args, rank, state)
    for (seconds,) in per_rank(args.sigterm_in_fence, rank, 2):
        threading.Thread(target=sigterm_in_fence, args=(prof, float(seconds)), daemon=True).start()
    torch.manual_seed(rank)
    layers = [torch.nn.Linear(64, 64) for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    grad_sync = torch.zeros(256)
    iterations = 0
    with prof:
        for iteration in range(1, args.iters + 1):
            at_iteration(args, prof, rank, iteration)
            model(torch.randn(16, 64)).pow(2).mean().backward()
            dist.all_reduce(grad_sync)
            optimizer.step()
            optimizer.zero_grad()
            prof.step(iteration)
            in_flight = prof._writer.in_flight if prof._writer is not None else 0  # noqa: SLF001
            state["max_in_flight"] = max(state.get("max_in_flight", 0), in_flight)
            iterations = iteration
        left_at = time.monotonic()
    exit_seconds = time.monotonic() - left_at
    if args.collective_after_exit:
        dist.all_reduce(grad_sync)
    write_json_atomically(results / f"rank{rank}.json", {
        "rank": rank, "iterations": iterations, "traces": prof.published_traces, "stats": prof.stats,
        "exit_seconds": exit_seconds, "log": records.lines,
        "skipped": prof._publishing.skipped,  # noqa: SLF001 - windows skipped by backpressure
        **{k: v for k, v in state.items() if k != "cycle"}, "submissions": state["cycle"]})
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
