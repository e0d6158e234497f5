"""The whole cost of a profiled window: the flush step's stall plus the slowdown of the steps after it
while the exporter and the publisher run, against unprofiled steps of the same job.

    python benchmarks/bench_window_cost.py [--repeats 8] [--layers 40] [--after 22]

Two real gloo ranks (torchrun), a ``--layers``-layer MLP (its gradients all-reduced in one bucket, as
DDP does), both ranks traced: ``--torch-profile-skip-first 20`` (unprofiled steps), warm-up 1, 3
active steps recorded with stacks, shapes and memory, then ``--after`` steps and 10 more.  Four
modes, interleaved in each repeat so that they see the same machine load:

  none     the same job without ``--torch-profile``
  normal   ``--torch-profile-publisher-priority normal --no-torch-profile-publisher-server``: the
           exporter execs a publisher per trace, at the trainer's priority (before issue 30)
  idle     ``--torch-profile-publisher-priority idle --no-torch-profile-publisher-server``: the same at
           nice 19, SCHED_IDLE, I/O idle
  server   the defaults: idle priority, and the publisher fork server started with the profiler forks
           a worker per trace (no Python start-up and imports per trace)

Per run, rank 0's step times.  The baseline step is the median of the run's own unprofiled steps
before its window (steps 6-20: the same job, unprofiled, seconds earlier; the repeat's ``none`` run's
median is printed beside it, but a shared machine's load drifts more between runs than within one).
``stall`` = the flush step minus the baseline; ``after`` = the sum over the ``--after`` following
steps of (step - baseline); ``recorded`` = the same over the 4 warm-up and recorded steps before the
flush; ``done`` = steps after the flush until rank 0's publisher had finished (``-``: not within the
run: it finishes at exit); ``cpu`` = rank 0's publication's CPU time (export, publisher; the
status' ``PublishCpu``; 0 when it finished after the run).  Medians over the repeats; ``est``
columns: the profiler's own running estimate (``prof.stats``, what the goodput ledger reads).  The
``server`` runs first wait for the fork server to finish starting (its imports at idle priority
would otherwise spread over the baseline steps and slow them); its CPU time then is printed: a cost
once per run, not per window.  Target (issue 30): ``after`` at most 25 % of ``stall`` with the
defaults on a 2-core machine.  The load average is printed before and after and with every repeat:
run it when the machine is quiet (``--max-load``: each repeat first waits, up to 15 minutes, for
the 1-minute load to fall below it).
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
SKIP_FIRST, WARMUP, ACTIVE = 20, 1, 3
FLUSH = SKIP_FIRST + WARMUP + ACTIVE  # the iteration whose step writes the trace
TAIL = 10  # steps run after the counted ones
QUIET = slice(5, SKIP_FIRST)  # the run's own unprofiled steps that make its baseline
MODES = ("none", "normal", "idle", "server")
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
    flags = [
        "--torch-profile-dir",
        str(Path(args.out) / "prof"),
        "--torch-profile-ranks",
        "all",
        "--torch-profile-skip-first",
        str(SKIP_FIRST),
        "--torch-profile-warmup",
        str(WARMUP),
        "--torch-profile-active",
        str(ACTIVE),
        "--torch-profile-repeat",
        "1",
        "--torch-profile-wait",
        "0",
        "--torch-profile-record-shapes",
        "--torch-profile-profile-memory",
        "--torch-profile-with-stack",
    ]
    if args.mode != "none":
        flags += ["--torch-profile", "--torch-profile-publisher-priority", "normal" if args.mode == "normal"
                  else "idle"]
    if args.mode in ("normal", "idle"):
        flags.append("--no-torch-profile-publisher-server")
    prof = TorchProfiler.from_args(add_torch_profile_args(argparse.ArgumentParser()).parse_args(flags))
    times, publishing = [], []
    with prof:
        writer = prof._writer  # noqa: SLF001 - the benchmark reads the real writer's state
        publishers = writer.publishers if writer is not None else None
        server = publishers.server_pid if publishers is not None else None
        waited = time.perf_counter()
        while publishers and server and not publishers.server_ready() and time.perf_counter() - waited < 99:
            time.sleep(0.01)  # its start-up (once per run) stays out of the measured steps
        start_wait, start_cpu = time.perf_counter() - waited, _cpu_seconds(server)
        for iteration in range(1, FLUSH + args.after + TAIL + 1):
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
        {"times": times, "stats": stats, "publishing": publishing, "server_start": [start_wait, start_cpu]},
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
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            __file__,
            "--worker",
            "--mode",
            mode,
            "--out",
            out,
            "--layers",
            str(args.layers),
            "--hidden",
            str(args.hidden),
            "--batch",
            str(args.batch),
            "--after",
            str(args.after),
        ]
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if run.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{(run.stdout + run.stderr)[-3000:]}")
        return json.loads((Path(out) / "rank0.json").read_text())


def costs(result: dict, after: int) -> dict[str, float]:
    """One profiled run's figures, seconds (``done``: steps)."""
    times = result["times"]
    baseline = statistics.median(times[QUIET])
    flush = FLUSH - 1  # index of the flush step
    extra = [t - baseline for t in times]
    busy = [i for i, n in enumerate(result["publishing"]) if n and i >= flush]
    done = float(busy[-1] + 1 - flush) if busy else 0.0
    if busy and busy[-1] == len(times) - 1:
        done = math.inf  # still publishing at the run's last step
    stats = result["stats"]
    start_wait, start_cpu = result["server_start"]
    return {
        "baseline": baseline,
        "stall": extra[flush],
        "after": sum(extra[flush + 1 : flush + 1 + after]),
        "recorded": sum(extra[SKIP_FIRST:flush]),
        "done": done,
        "cpu": stats.get("publish_cpu_seconds", 0.0),
        "server_start_cpu": start_cpu,
        "server_start_wait": start_wait,
        "est_stall": stats.get("flush_seconds_total", 0.0),
        "est_after": stats.get("publishing_extra_seconds_total", 0.0),
        "est_recorded": stats.get("recording_extra_seconds_total", 0.0),
    }


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _ms(value: float) -> str:
    return f"{value * 1000:+.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--after", type=int, default=22, help="steps after the flush that are counted")
    parser.add_argument("--max-load", type=float, default=None,
                        help="before each repeat, wait (up to 15 min) for the 1-minute load average to fall "
                             "below this")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip teardown, where torch's C++ threads sometimes abort on this CPU build
    print(f"load average before: {load()} ({os.cpu_count()} CPUs)", flush=True)
    rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in PROFILED}
    unprofiled = []
    for repeat in range(args.repeats):
        wait_for_quiet(args.max_load)
        results = {mode: run_job(mode, args) for mode in MODES}
        unprofiled.append(statistics.median(results["none"]["times"][QUIET.start :]))
        line = [f"repeat {repeat + 1}: unprofiled run {unprofiled[-1] * 1000:.1f} ms/step"]
        for mode, runs in rows.items():
            runs.append(costs(results[mode], args.after))
            got = runs[-1]
            line.append(
                f"{mode}: step {got['baseline'] * 1000:.1f} ms, stall {_ms(got['stall'])} ms, "
                f"after {_ms(got['after'])} ms"
            )
        print("  " + "; ".join(line) + f" (load {load()})", flush=True)
    print(
        f"\nwindow cost on rank 0, ms (median of {args.repeats}; 2 gloo ranks, {args.layers}-layer MLP, "
        f"{ACTIVE} active steps with stacks, shapes, memory; {args.after} steps after the flush; unprofiled "
        f"step {statistics.median(unprofiled) * 1000:.1f} ms)"
    )
    print(
        f"{'mode':8s}{'step':>7s}{'stall':>8s}{'after':>8s}{'after/stall':>12s}{'recorded':>10s}"
        f"{'done':>6s}{'cpu':>6s}{'est stall':>11s}{'est after':>11s}{'est rec.':>10s}"
    )
    for mode, runs in rows.items():
        med = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        done = "-" if math.isinf(med["done"]) else f"{med['done']:.0f}"
        print(
            f"{mode:8s}{med['baseline'] * 1000:7.1f}{med['stall'] * 1000:8.0f}{med['after'] * 1000:8.0f}"
            f"{med['after'] / med['stall']:12.2f}{med['recorded'] * 1000:10.0f}{done:>6s}"
            f"{med['cpu'] * 1000:6.0f}{med['est_stall'] * 1000:11.0f}{med['est_after'] * 1000:11.0f}"
            f"{med['est_recorded'] * 1000:10.0f}"
        )
    start_cpu = statistics.median(run["server_start_cpu"] for run in rows["server"])
    start_wait = statistics.median(run["server_start_wait"] for run in rows["server"])
    print(
        f"\nserver: its start-up (imports, once per run, before the first step here: the job waited "
        f"{start_wait * 1000:.0f} ms for it) took {start_cpu * 1000:.0f} ms of CPU"
    )
    for mode in ("idle", "server"):
        ratios = [run["after"] / run["stall"] for run in rows[mode]]
        ratio = statistics.median(ratios)
        print(
            f"target after/stall <= 0.25 with {mode}: {'met' if ratio <= 0.25 else 'NOT met'} "
            f"(median {ratio:.2f}; per repeat {', '.join(f'{r:.2f}' for r in ratios)})"
        )
    print(f"load average after: {load()}")


def wait_for_quiet(max_load: float | None, patience: float = 900.0) -> None:
    """Wait until the 1-minute load average is below ``max_load`` (at most ``patience`` seconds)."""
    waited = time.monotonic()
    while max_load is not None and os.getloadavg()[0] > max_load and time.monotonic() - waited < patience:
        time.sleep(10)


if __name__ == "__main__":
    main()
