"""A 512-rank job's cycle: `torchprof summary` / `report` from sidecars, and the sharded parse without them.

    python benchmarks/bench_many_ranks.py [--ranks 512] [--shards 8] [--repeat 3]

Builds once, under benchmarks/out/many_ranks/ (git-ignored), the folder a 512-rank job leaves
for one profiled cycle, in the layout the profiler writes:

    run/iter000100-000101/rank00000_node000_pid10000.pt.trace.json.gz  ... rank00511_...
    run/iter000100-000101/summaries/rank00000_node000_pid10000.summary.json ...

Each rank's trace is one of the two real ranks of a 128-rank job in tests/data (hard links: the
job's files cost no disk); each rank's sidecar is that trace's real summary with perturbed figures: its rank,
host (8 ranks a node), parallel coordinates (tp 8 x pp 4 x dp), step times (+-2 %, and one node
of stragglers 8-15 % slower), GPU idle and overlap.  Then, in fresh processes:

* ``torchprof summary DIR`` and ``torchprof report DIR`` with the sidecars (target: < 5 s);
* the no-sidecar path: ``torchprof summary --write-sidecars --reparse --shard K/N DIR`` for the
  first shards, one at a time, throughput per shard (MB of trace JSON per second, wall and per
  CPU-second) side by side with ``torchprof summary`` of one 1 GB trace of the same shape (target:
  equal); once on the 512 small real traces (1.7 MB of JSON each: per-trace costs show), once on
  8 ranks of 256 MB traces (replicas of the same trace; ``--big-rank-mb``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from torchprof_args.analysis import load_trace, summarize  # noqa: E402
from torchprof_args.analysis.collect.sidecar import write_sidecar  # noqa: E402
from torchprof_args.analysis.jsonout import finite  # noqa: E402
from torchprof_args.naming import cycle_dir_name  # noqa: E402

#: two ranks of one real 128-rank job: every simulated rank is one of them.
SOURCES = sorted((REPO / "tests" / "data").glob("gpu_128rank_sampled_rank*.json.gz"))
TP, PP = 8, 4


def _perturbed(summary: dict, rank: int, world: int, rng: random.Random, slow_node: int) -> dict:
    """``summary`` as rank ``rank`` of a ``world``-rank job would have written it."""
    s = copy.deepcopy(summary)
    node = rank // 8
    factor = rng.gauss(1.0, 0.02) * (rng.uniform(1.08, 1.15) if node == slow_node else 1.0)
    s.update(rank=rank, world_size=world, host=f"node{node:03d}", iterations=[100, 101],
             parallel={"dp": rank // (TP * PP), "tp": rank % TP, "pp": (rank // TP) % PP})
    s["steps"] = [dict(step, dur_us=step["dur_us"] * factor * rng.gauss(1.0, 0.005)) for step in s["steps"]]
    s["step_mean_us"] = sum(step["dur_us"] for step in s["steps"]) / max(len(s["steps"]), 1)
    if s.get("work_mean_us") is not None:  # the slow node works longer; the others wait in collectives
        s["work_mean_us"] *= factor * rng.gauss(1.0, 0.005)
    gpu = s.get("gpu")
    if gpu:
        gpu["idle_pct"] = min(max(gpu["idle_pct"] * rng.gauss(1.0, 0.05) * factor, 0.0), 100.0)
        if gpu.get("comm_comp_overlap_pct") is not None:
            jittered = gpu["comm_comp_overlap_pct"] * rng.gauss(1.0, 0.08)
            gpu["comm_comp_overlap_pct"] = min(max(jittered, 0.0), 100.0)
        for table in (gpu["kernel_type_us"], gpu["kernel_type_overlapping_us"]):
            for key in table:
                table[key] *= rng.gauss(1.0, 0.02)
    return s


def build(out: Path, ranks: int) -> Path:
    """The run folder (built once): one cycle of ``ranks`` traces with their sidecars."""
    run = out / f"run{ranks}"
    cycle = run / cycle_dir_name(100, 101)
    marker = run / ".complete-v2"  # sidecars with the summary's work per step
    if marker.exists():
        return run
    cycle.mkdir(parents=True, exist_ok=True)
    summaries = [finite(summarize(load_trace(src), top=None)) for src in SOURCES]
    rng = random.Random(13)
    slow_node = rng.randrange(max(ranks // 8, 1))
    for rank in range(ranks):
        which = rank % len(SOURCES)
        trace = cycle / f"rank{rank:05d}_node{rank // 8:03d}_pid{10000 + rank}.pt.trace.json.gz"
        if not trace.exists():
            os.link(SOURCES[which], trace)
        write_sidecar(trace, {"summary": _perturbed(summaries[which], rank, ranks, rng, slow_node)})
    marker.touch()
    return run


def _timed(args: list[str]) -> tuple[float, str, float]:
    """(wall s, stdout, CPU s of the command and its children) of one ``torchprof`` run."""
    import resource

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torchprof_args", *args], capture_output=True, text=True,
                          env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"torchprof {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return wall, proc.stdout, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _best(args: list[str], repeat: int) -> tuple[float, str]:
    runs = [_timed(args) for _ in range(max(repeat, 1))]
    return min(r[0] for r in runs), runs[-1][1]


def _shard_rate(run: Path, k: int, n: int, repeat: int) -> tuple[float, float, float, int, float]:
    """(wall s, MB/s, MB per CPU-second, traces, MB) of one shard's --write-sidecars --reparse, best
    of ``repeat``."""
    command = ["summary", "--write-sidecars", "--reparse", "--no-progress", "--shard", f"{k}/{n}", str(run)]
    runs = [_timed(command) for _ in range(max(repeat, 1))]
    wall, stdout, cpu = min(runs, key=lambda r: r[0])
    match = re.search(r"(\d+) of \d+ trace\(s\): (\d+) sidecar\(s\) written \(([\d,]+) MB parsed", stdout)
    if match is None:
        raise SystemExit(f"unexpected output: {stdout[-500:]}")
    mb = float(match.group(3).replace(",", ""))
    return wall, mb / wall, mb / cpu, int(match.group(1)), mb


def _big_run(out: Path, source: Path, ranks: int, rank_mb: float) -> Path:
    """A cycle of ``ranks`` traces of ``rank_mb`` MB each (hard links of one replica), no sidecars."""
    from bench_shapes import replica

    big = replica(source, rank_mb, HERE / "out" / "shapes", True)
    cycle = out / f"big{ranks}x{int(rank_mb)}" / cycle_dir_name(100, 101)
    cycle.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        target = cycle / f"rank{rank:05d}_node{rank // 8:03d}_pid{20000 + rank}.pt.trace.json.gz"
        if not target.exists():
            os.link(big, target)
    return cycle.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4, help="N of --shard K/N for the no-sidecar path")
    parser.add_argument("--shards-run", type=int, default=2, help="how many of the N shards to run and time")
    parser.add_argument("--big-ranks", type=int, default=8, help="ranks of the large-trace no-sidecar run")
    parser.add_argument("--big-rank-mb", type=float, default=256, help="MB of JSON per rank there (0: skip)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--big-mb", type=float, default=1024,
                        help="size of the single-trace reference (.json.gz)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "many_ranks")
    args = parser.parse_args(argv)
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    run = build(args.out, args.ranks)
    report = args.out / f"report{args.ranks}.html"

    summary_s, summary_out = _best(["summary", "--no-progress", str(run)], args.repeat)
    json_s, _ = _best(["summary", "--no-progress", "--json", str(run)], args.repeat)
    report_s, _ = _best(["report", "--no-progress", str(run), "-o", str(report)], args.repeat)
    scratch = args.out / f"noside{args.ranks}"
    if not scratch.exists():  # the same traces, no sidecars (hard links again)
        for trace in sorted((run / cycle_dir_name(100, 101)).glob("*.pt.trace.json.gz")):
            target = scratch / trace.parent.name / trace.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(trace, target)
    run_shards = range(min(args.shards_run, args.shards))
    shards = [_shard_rate(scratch, k, args.shards, args.repeat) for k in run_shards]
    big_shards = []
    if args.big_rank_mb > 0:
        big_run = _big_run(args.out, SOURCES[0], args.big_ranks, args.big_rank_mb)
        big_shards = [_shard_rate(big_run, k, args.shards, args.repeat) for k in run_shards]
    from bench_shapes import replica, run_once, uncompressed_mb

    big = replica(SOURCES[0], args.big_mb, HERE / "out" / "shapes", True)
    big_mb = uncompressed_mb(big)
    big_runs = [run_once(big) for _ in range(max(args.repeat, 1))]
    best_big = min(big_runs, key=lambda r: r["wall_s"])
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())

    print(f"\n{args.ranks} ranks, one cycle ({run}); {os.cpu_count()} CPUs; load average {load_before} at "
          f"start, {load_after} at end; best of {args.repeat}")
    print(f"{'':62} {'wall s':>7}  target")
    for label, secs in (("torchprof summary DIR (sidecars, text)", summary_s),
                        ("torchprof summary --json DIR (sidecars)", json_s),
                        ("torchprof report DIR -o report.html (sidecars)", report_s)):
        print(f"{label:62} {secs:7.2f}  < 5 s {'ok' if secs < 5 else 'MISSED'}")
    print(f"report: {report.stat().st_size / 1e6:.2f} MB")
    print(f"\nno sidecars: torchprof summary --write-sidecars --reparse --shard K/{args.shards} DIR, "
          "one shard at a time")
    print(f"{'':62} {'wall s':>7} {'MB':>7} {'MB/s':>6} {'MB/CPU-s':>9}")
    for label, rows in ((f"{args.ranks} real traces, 1.7 MB each", shards),
                        (f"{args.big_ranks} traces of {args.big_rank_mb:.0f} MB", big_shards)):
        for k, (wall, rate, per_cpu, n, mb) in enumerate(rows):
            print(f"{f'shard {k}/{args.shards}: {n} of {label}':62} {wall:7.2f} {mb:7.0f} {rate:6.0f} "
                  f"{per_cpu:9.0f}")
    print(f"{f'single trace: torchprof summary ({big_mb:,.0f} MB .json.gz)':62} {best_big['wall_s']:7.2f} "
          f"{big_mb:7.0f} {big_mb / best_big['wall_s']:6.0f} {big_mb / best_big['cpu_s']:9.0f}")
    print("\nslowest ranks (from the text view):")
    print("\n".join(line for line in summary_out.splitlines()
                    if "slowest rank" in line or "stragglers" in line))
    print(json.dumps({"summary_s": summary_s, "summary_json_s": json_s, "report_s": report_s,
                      "shard_mb_per_s": [r[1] for r in shards],
                      "big_shard_mb_per_s": [r[1] for r in big_shards],
                      "single_trace_mb_per_s": big_mb / best_big["wall_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
