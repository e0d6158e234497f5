"""Weeks of ``--torch-profile-repeat 0`` in minutes: memory, descriptors, threads and staging stay flat.

    python benchmarks/bench_soak.py [--cycles 1000] [--every 100] [--step-seconds 0.03]

Two gloo ranks (torchrun), both traced, a cycle every 3 steps (wait 2, warmup 0, active 1, repeat
0, ``--torch-profile-max-publishing`` 2) with an on-demand request (1 iteration, all ranks)
submitted by rank 0 every 10 cycles, so on-demand windows interleave with the scheduled ones.
Every ``--every`` cycles each rank waits until its publishers are done (between flushes) and
samples its RSS, open descriptors, threads, bytes in its staging directories and the files in the
output directory; the table below is printed from those samples, then the end state: staging
directories left, publisher processes alive, partial files, windows skipped by backpressure.

Targets (issue 21): RSS growth under 1 MB per 100 cycles after the first 100, descriptors and
threads equal to their first sample, staging empty at every sample, nothing left at exit.
Output under benchmarks/out/soak/ (git-ignored; removed first), or ``--out DIR``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "out" / "soak"
CYCLE = 3  # wait 2, warmup 0, active 1
ON_DEMAND_EVERY = 10  # cycles


def _sample(prof, output: Path) -> dict:
    """This rank's figures once its publishers are done (bounded wait)."""
    writer = prof._writer  # noqa: SLF001 - the benchmark reads the real writer's state
    deadline = time.monotonic() + 120
    while writer.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    status = Path("/proc/self/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    staged = sum(f.stat().st_size for d in writer.staging.dirs if d.exists()
                 for f in d.rglob("*") if f.is_file())
    return {"rss_mb": rss_kb / 1024, "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")), "staging_bytes": staged,
            "output_files": sum(1 for p in output.rglob("*") if p.is_file()),
            "in_flight_waited": writer.in_flight, "published": len(writer.published)}


def worker(args: argparse.Namespace) -> None:
    out = Path(args.out)
    import torch
    import torch.distributed as dist

    from torchprof_args import TorchProfiler, add_torch_profile_args
    from torchprof_args.atomic import write_json_atomically
    from torchprof_args.capture.ondemand.client import submit

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    output = out / "prof"
    argv = ["--torch-profile", "--torch-profile-ranks", "all", "--torch-profile-dir", str(output),
            "--torch-profile-repeat", "0", "--torch-profile-wait", "2", "--torch-profile-warmup", "0",
            "--torch-profile-active", "1", "--torch-profile-skip-first", "0", "--torch-profile-on-demand",
            "--torch-profile-on-demand-interval", "1", "--torch-profile-on-demand-check-seconds", "0.1"]
    prof = TorchProfiler.from_args(add_torch_profile_args(argparse.ArgumentParser()).parse_args(argv))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    samples, requests = [], 0
    with prof:
        control = Path(prof.config.on_demand.control_dir) if rank == 0 else None
        for iteration in range(1, args.cycles * CYCLE + 1):
            model(torch.randn(16, 64)).pow(2).mean().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(args.step_seconds)
            prof.step(iteration)
            cycle, phase = divmod(iteration, CYCLE)
            if control is not None and phase == 1 and cycle % ON_DEMAND_EVERY == 5:
                submit(control, 1, "all")
                requests += 1
            if phase == 1 and cycle and cycle % args.every == 0:  # after a flush: between flushes
                samples.append({"cycle": cycle, **_sample(prof, output)})
    stats = prof.stats
    write_json_atomically(out / "results" / f"rank{rank}.json", {
        "rank": rank, "pid": os.getpid(), "samples": samples, "requests": requests,
        "skipped": prof._publishing.skipped, "published": len(prof.published_traces),  # noqa: SLF001
        "failures": stats.get("publish_failures", 0),
        "staging_left": [str(d) for d in prof._writer.staging.dirs if d.exists()]})  # noqa: SLF001
    dist.barrier()
    dist.destroy_process_group()


def _report(results: list[dict], seconds: float, args: argparse.Namespace) -> None:
    print(f"bench_soak: 2 gloo ranks, {args.cycles} cycles of {CYCLE} steps (repeat 0), on-demand request "
          f"every {ON_DEMAND_EVERY} cycles, {seconds:.0f} s (CPU, this machine)")
    for result in results:
        print(f"\nrank {result['rank']}: {result['published']} traces published, {result['skipped']} "
              f"windows skipped (publishing behind), {result['failures']} failed, {result['requests']} "
              "requests sent")
        print(f"{'cycle':>6s}{'RSS MB':>9s}{'dRSS MB':>9s}{'fds':>5s}{'thr':>5s}{'staging B':>10s}"
              f"{'out files':>10s}{'traces':>8s}")
        previous = None
        for s in result["samples"]:
            grow = s["rss_mb"] - previous if previous is not None else 0.0
            previous = s["rss_mb"]
            print(f"{s['cycle']:6d}{s['rss_mb']:9.1f}{grow:9.2f}{s['fds']:5d}{s['threads']:5d}"
                  f"{s['staging_bytes']:10d}{s['output_files']:10d}{s['published']:8d}")
        samples = result["samples"]
        if len(samples) >= 2:  # the first sample (after the first --every cycles) is the baseline
            growth = [b["rss_mb"] - a["rss_mb"] for a, b in zip(samples, samples[1:], strict=False)]
            flat_fd = all(s["fds"] == samples[0]["fds"] for s in samples)
            flat_thr = all(s["threads"] == samples[0]["threads"] for s in samples)
            empty = all(s["staging_bytes"] == 0 for s in samples)
            print(f"max RSS growth per {args.every} cycles after the first {args.every}: "
                  f"{max(growth):.2f} MB ({'met' if max(growth) < 1.0 else 'NOT met'}: < 1 MB); descriptors "
                  f"back to baseline: {flat_fd}; threads: {flat_thr}; staging empty at every sample: {empty}")
        print(f"staging directories left at exit: {result['staging_left'] or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100, help="cycles between samples")
    parser.add_argument("--step-seconds", type=float, default=0.03, help="extra time per training step")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (removed first)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    (out / "tmp").mkdir(parents=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out / "tmp"),
           "TORCHPROF_RUNTIME_DIR": str(out / "runtime"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "--master_addr=127.0.0.1", f"--master_port={port}", __file__, "--worker",
                          "--cycles", str(args.cycles), "--every", str(args.every),
                          "--step-seconds", str(args.step_seconds), "--out", str(out)],
                         capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    results = sorted((json.loads(p.read_text()) for p in (out / "results").glob("rank*.json")),
                     key=lambda r: r["rank"])
    if run.returncode != 0 or len(results) != 2:
        raise SystemExit(f"the soak job failed:\n{(run.stdout + run.stderr)[-4000:]}")
    _report(results, seconds, args)
    time.sleep(0.5)
    alive = _publishers_mentioning(str(out))
    partial = [str(p) for p in (out / "prof").rglob(".partial*")]
    shm = [str(p) for r in results for p in Path("/dev/shm").glob(f"torchprof-{os.getuid()}/pid{r['pid']}")]
    print(f"\nat exit: publisher processes alive {len(set(alive))}, partial files {len(partial)}, "
          f"staging dirs in /dev/shm {len(shm)}, in TMPDIR {sum(1 for _ in (out / 'tmp').rglob('pid*'))}")
    log_lines = [line for line in (run.stdout + run.stderr).splitlines() if "[torchprof rank" in line]
    print(f"torchprof log lines: {len(log_lines)} in all "
          f"({sum('rank 1]' in line for line in log_lines)} from rank 1); the first of each kind on rank 0:")
    for kind in ("published up to", "publishing is behind", "publishing caught up", "at exit:"):
        first = next((line.split(": ", 1)[-1] for line in log_lines if kind in line), f"(no {kind!r} line)")
        print(f"  {first}")


def _publishers_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and "publisher" in cmdline:
                found.append(int(entry.name))
    return found


if __name__ == "__main__":
    main()
