"""The whole cost of a profiled window: the flush step's stall plus the slowdown of the steps after it
while the exporter and the publisher run, against unprofiled steps of the same job.

    python benchmarks/bench_window_cost.py [--repeats 10] [--windows 3] [--layers 40] [--after 22]
                                           [--max-load 2] [--modes none inline defaults]

Two real gloo ranks (torchrun), a ``--layers``-layer MLP (its gradients all-reduced in one bucket, as
DDP does), both ranks traced: ``--windows`` windows per run, each ``--gap`` unprofiled steps
(``--torch-profile-wait``), warm-up 1, 3 active steps recorded with stacks, shapes and memory; then
10 more steps.  Six modes (``--modes``: some of them; ``none`` always runs), interleaved in each
repeat so that they see the same machine load:

  none      the same job without ``--torch-profile``
  inline    ``--torch-profile-export inline --no-torch-profile-gzip --no-torch-profile-operator-table``:
            the training thread writes the trace, uncompressed, and nothing is analysed: what writing
            the trace alone costs (issue 34's yardstick)
  normal    ``--torch-profile-publisher-priority normal --torch-profile-publish-wait never``: the rank's
            publisher (one long-lived process, started with the profiler) at the trainer's priority,
            in the background
  idle      the same at ``idle`` priority: nice 19, SCHED_IDLE, I/O idle
  idle1     ``idle`` with ``--torch-profile-gzip-level 1`` (isal's level 1 where installed: about 4x
            less compression CPU than zlib's level 6, the default, for about 35 % larger traces)
  defaults  the defaults: ``idle`` with ``--torch-profile-publish-wait auto``, which waits for the
            publication at the flush when the node's cores were busy (here: two ranks on two cores)

Per window, rank 0's step times against a baseline: the median of the 15 unprofiled steps just
before its warm-up (the same job, seconds earlier, after the previous window's publication: a
shared machine's load drifts more between runs than within one; the repeat's ``none`` run's median
is printed beside it).  ``stall`` = the flush step minus the baseline; ``after`` = the sum over the
``--after`` following steps of (step - baseline); ``net``: each less the same figure over the same
steps of the repeat's ``none`` run (step times skew to the right: unprofiled, 22 steps already sum
above 22 times their median; the ``none`` row shows by how much), the issue's "against an
unprofiled run of the same job"; ``recorded`` = the same over the warm-up and
recorded steps before the flush; ``done`` = steps after the flush until rank 0's publication had
finished (``-``: not within the gap); ``cpu`` = the CPU time of rank 0's last publication (export,
publisher: the status' ``PublishCpu``; 0 when it finished after the run).  Medians over every
window of every repeat; ``est`` columns: the profiler's own running estimate per window
(``prof.stats``, what the goodput ledger reads).  Every profiled run but ``inline``'s first waits for
the rank's publisher to finish starting (its imports would otherwise slow the first steps); its CPU
time is printed: a cost once per run, not per window.  ``net total``: net stall plus net after, the
window's whole cost.  Targets: (issue 30) the net ``after`` at most 25 % of the net ``stall`` on a
2-core machine; (issue 34) the defaults' net total at most 1.5x the ``inline`` run's.  The load
average is printed before and after and with every repeat: run it when the machine is quiet
(``--max-load``: each repeat first waits, up to 15 minutes, for the 1-minute load to fall below it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP, ACTIVE = 1, 3
TAIL = 10  # steps run after the last window's counted ones
BASELINE_STEPS = 15  # unprofiled steps just before a window's warm-up
MODES = ("none", "inline", "normal", "idle", "idle1", "defaults")
PROFILED = MODES[1:]


def _cpu_seconds(pid: int | None) -> float:
    """A process's user + system CPU seconds (``/proc/<pid>/stat``); 0 when it cannot be read."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _started_publisher(deadline: float) -> int | None:
    """This rank's publisher once it has finished starting (its CPU time stopped growing), or None."""
    pid, spent = None, -1.0
    while time.monotonic() < deadline:
        tasks = Path(f"/proc/{os.getpid()}/task").glob("*/children")
        children = [int(c) for task in tasks for c in task.read_text().split()]
        found = [c for c in children if b"runtime.export.publisher" in _cmdline(c)]
        if found and _cpu_seconds(found[0]) == spent:
            return found[0]
        pid, spent = (found[0], _cpu_seconds(found[0])) if found else (pid, spent)
        time.sleep(0.2)
    return pid


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def flush_steps(args: argparse.Namespace) -> list[int]:
    """The 1-based iterations whose steps write a trace."""
    cycle = args.gap + WARMUP + ACTIVE
    return [cycle * (k + 1) for k in range(args.windows)]


def profile_flags(args: argparse.Namespace) -> list[str]:
    flags = [
        "--torch-profile-dir", str(Path(args.out) / "prof"), "--torch-profile-ranks", "all",
        "--torch-profile-skip-first", "0", "--torch-profile-wait", str(args.gap),
        "--torch-profile-warmup", str(WARMUP), "--torch-profile-active", str(ACTIVE),
        "--torch-profile-repeat", str(args.windows), "--torch-profile-max-publishing", "0",
        "--torch-profile-record-shapes", "--torch-profile-profile-memory", "--torch-profile-with-stack",
    ]
    if args.mode == "none":
        return flags
    flags.append("--torch-profile")
    if args.mode == "defaults":
        return flags
    if args.mode == "inline":
        return [*flags, "--torch-profile-export", "inline", "--no-torch-profile-gzip",
                "--no-torch-profile-operator-table"]
    priority = "normal" if args.mode == "normal" else "idle"
    flags += ["--torch-profile-publisher-priority", priority, "--torch-profile-publish-wait", "never"]
    if args.mode == "idle1":
        flags += ["--torch-profile-gzip-level", "1"]
    return flags


def worker(args: argparse.Namespace) -> None:
    """One rank of the job (under torchrun): per-step wall times, publications in flight, prof.stats."""
    import datetime

    import torch
    import torch.distributed as dist

    from torchprof_args import TorchProfiler, add_torch_profile_args
    from torchprof_args.atomic import write_json_atomically

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    inputs = torch.randn(args.batch, args.hidden)
    parser = add_torch_profile_args(argparse.ArgumentParser())
    prof = TorchProfiler.from_args(parser.parse_args(profile_flags(args)))
    times, publishing = [], []
    with prof:
        writer = prof._writer  # noqa: SLF001 - the benchmark reads the real writer's state
        waited = time.perf_counter()
        publisher = _started_publisher(time.monotonic() + 99) if writer is not None else None
        start_wait, start_cpu = time.perf_counter() - waited, _cpu_seconds(publisher)
        for iteration in range(1, flush_steps(args)[-1] + args.after + TAIL + 1):
            started = time.perf_counter()
            model(inputs).square().mean().backward()
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)  # one bucket, as DDP does
            torch.nn.utils.vector_to_parameters(flat, grads)
            optimizer.step()
            optimizer.zero_grad()
            prof.step(iteration)
            times.append(time.perf_counter() - started)
            publishing.append(writer.in_flight if writer is not None else 0)
        stats = prof.stats
    write_json_atomically(
        Path(args.out) / f"rank{rank}.json",
        {"times": times, "stats": stats, "publishing": publishing,
         "publisher_start": [start_wait, start_cpu]},
    )
    dist.barrier()
    dist.destroy_process_group()


def run_job(mode: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="window-cost-") as out:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "TORCHPROF_LOG_LEVEL": "WARNING",
            "TMPDIR": out,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        }
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
            f"--master_port={port}", __file__, "--worker", "--mode", mode, "--out", out,
            "--layers", str(args.layers), "--hidden", str(args.hidden), "--batch", str(args.batch),
            "--after", str(args.after), "--windows", str(args.windows), "--gap", str(args.gap),
        ]
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if run.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{(run.stdout + run.stderr)[-3000:]}")
        return json.loads((Path(out) / "rank0.json").read_text())


def window_costs(result: dict, args: argparse.Namespace) -> list[dict[str, float]]:
    """One profiled run's figures per window, seconds (``done``: steps)."""
    times, publishing, stats = result["times"], result["publishing"], result["stats"]
    start_wait, start_cpu = result["publisher_start"]
    windows = []
    for flush_step in flush_steps(args):
        flush = flush_step - 1  # its index
        first = flush - ACTIVE - WARMUP + 1  # the warm-up step's index
        baseline = statistics.median(times[first - BASELINE_STEPS : first])
        extra = [t - baseline for t in times]
        gap_end = min(len(times), flush + 1 + args.gap)
        quiet = [i for i in range(flush + 1, gap_end) if not publishing[i]]
        windows.append({
            "baseline": baseline,
            "stall": extra[flush],
            "after": sum(extra[flush + 1 : flush + 1 + args.after]),
            "recorded": sum(extra[first:flush]),
            "done": float(quiet[0] - flush) if quiet else math.inf,
            "cpu": stats.get("publish_cpu_seconds", 0.0),
            "publisher_start_cpu": start_cpu,
            "publisher_start_wait": start_wait,
            "est_stall": stats.get("flush_seconds_total", 0.0) / args.windows,
            "est_after": stats.get("publishing_extra_seconds_total", 0.0) / args.windows,
            "est_recorded": stats.get("recording_extra_seconds_total", 0.0) / args.windows,
        })
    return windows


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_quiet(max_load: float | None, patience: float = 900.0) -> None:
    """Wait until the 1-minute load average is below ``max_load`` (at most ``patience`` seconds)."""
    waited = time.monotonic()
    while max_load is not None and os.getloadavg()[0] > max_load and time.monotonic() - waited < patience:
        time.sleep(10)


def _ms(value: float) -> str:
    return f"{value * 1000:+.0f}"


def report(rows: dict[str, list[dict[str, float]]], unprofiled: list[float],
           args: argparse.Namespace) -> None:
    count = len(next(iter(rows.values())))
    print(
        f"\nwindow cost on rank 0, ms (median of {count} windows: {args.repeats} repeats x {args.windows}; "
        f"2 gloo ranks, {args.layers}-layer MLP, {ACTIVE} active steps with stacks, shapes, memory; "
        f"{args.after} steps after the flush; unprofiled step {statistics.median(unprofiled) * 1000:.1f} ms)"
    )
    print(
        f"{'mode':9s}{'step':>7s}{'stall':>8s}{'after':>8s}{'after/stall':>12s}{'net after':>10s}"
        f"{'net ratio':>10s}{'net total':>10s}{'recorded':>10s}{'done':>6s}{'cpu':>6s}{'est stall':>11s}"
        f"{'est after':>11s}"
        f"{'est rec.':>10s}"
    )
    for mode, runs in rows.items():
        med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        done = "-" if math.isinf(med["done"]) else f"{med['done']:.0f}"
        net = (f"{med['after_net'] * 1000:10.0f}{statistics.median(_net_ratios(runs)):10.2f}"
               f"{statistics.median(r['stall_net'] + r['after_net'] for r in runs) * 1000:10.0f}"
               if "after_net" in med else f"{'-':>10s}{'-':>10s}{'-':>10s}")
        print(
            f"{mode:9s}{med['baseline'] * 1000:7.1f}{med['stall'] * 1000:8.0f}{med['after'] * 1000:8.0f}"
            f"{_ratio(med['after'], med['stall']):>12s}{net}{med['recorded'] * 1000:10.0f}{done:>6s}"
            f"{med['cpu'] * 1000:6.0f}{med['est_stall'] * 1000:11.0f}{med['est_after'] * 1000:11.0f}"
            f"{med['est_recorded'] * 1000:10.0f}"
        )
    served = [run for mode in ("normal", "idle", "idle1", "defaults") for run in rows.get(mode, [])]
    if served:
        start_cpu = statistics.median(run["publisher_start_cpu"] for run in served)
        start_wait = statistics.median(run["publisher_start_wait"] for run in served)
        print(
            f"\npublisher: its start-up (imports, once per run, before the first step here: the job waited "
            f"{start_wait * 1000:.0f} ms for it) took {start_cpu * 1000:.0f} ms of CPU"
        )
    if "inline" in rows and "defaults" in rows:
        def total(mode: str) -> float:
            return statistics.median(r["stall_net"] + r["after_net"] for r in rows[mode])
        ratio = total("defaults") / total("inline") if total("inline") > 0 else math.inf
        print(f"target defaults' net total <= 1.5x inline's (writing the trace alone): "
              f"{'met' if ratio <= 1.5 else 'NOT met'} ({total('defaults') * 1000:.0f} against "
              f"{total('inline') * 1000:.0f} ms: {ratio:.2f}x)")
    for mode in (m for m in PROFILED if m in rows and m != "inline"):
        ratios = _net_ratios(rows[mode])
        ratio = statistics.median(ratios)
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
        print(
            f"target net after / net stall <= 0.25 with {mode}: {'met' if ratio <= 0.25 else 'NOT met'} "
            f"(median {ratio:.2f}, quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}, {len(ratios)} windows)"
        )


def _ratio(after: float, stall: float) -> str:
    return f"{after / stall:.2f}" if stall > 0 else "-"


def _net_ratios(runs: list[dict[str, float]]) -> list[float]:
    """Per window, its later steps' extra time over its stall, each less the same steps' figure in
    the unprofiled run (whose step times, skewed to the right, sum above their median too)."""
    return sorted(run["after_net"] / run["stall_net"] for run in runs if run["stall_net"] > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--windows", type=int, default=3, help="profiled windows per run")
    parser.add_argument("--gap", type=int, default=60, help="unprofiled steps before each window")
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--after", type=int, default=22, help="steps after the flush that are counted")
    parser.add_argument("--max-load", type=float, default=None,
                        help="before each repeat, wait (up to 15 min) for the 1-minute load average to fall "
                             "below this")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="the modes to run (none always runs: the baseline)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip teardown, where torch's C++ threads sometimes abort on this CPU build
    if args.gap < args.after + BASELINE_STEPS:
        parser.error(f"--gap must be at least --after + {BASELINE_STEPS} (the next window's baseline)")
    print(f"load average before: {load()} ({os.cpu_count()} CPUs)", flush=True)
    modes = ["none", *(m for m in PROFILED if m in args.modes)]
    rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    unprofiled = []
    for repeat in range(args.repeats):
        wait_for_quiet(args.max_load)
        results = {mode: run_job(mode, args) for mode in modes}
        unprofiled.append(statistics.median(results["none"]["times"][BASELINE_STEPS:]))
        line = [f"repeat {repeat + 1}: unprofiled run {unprofiled[-1] * 1000:.1f} ms/step"]
        floor = window_costs(results["none"], args)  # the same steps of the unprofiled run
        rows["none"] += floor
        for mode in modes[1:]:
            got = [{**w, "after_net": w["after"] - f["after"], "stall_net": w["stall"] - f["stall"]}
                   for w, f in zip(window_costs(results[mode], args), floor, strict=True)]
            rows[mode] += got
            line.append(f"{mode}: stall {'/'.join(_ms(w['stall']) for w in got)} ms, after "
                        f"{'/'.join(_ms(w['after']) for w in got)} ms")
        print("  " + "; ".join(line) + f" (load {load()})", flush=True)
    report(rows, unprofiled, args)
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
