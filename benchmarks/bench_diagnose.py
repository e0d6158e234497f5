"""`torchprof diagnose` at scale: 512 ranks from sidecars (target < 5 s), MB/s on a 1 GB trace without.

    python benchmarks/bench_diagnose.py [--ranks 512] [--size-mb 1100] [--repeat 3]

Builds once, under benchmarks/out/diagnose/ (git-ignored):

* one cycle of a 512-rank job in the profiler's layout: each rank's trace a hard link to rank 0 of
  the 128-rank job in tests/data, each rank's sidecar that trace's real summary and real per-rank
  diagnosis (``rank_diagnosis``: findings, steps, collective records) renumbered to
  its rank, with one node (8 ranks) doing 60 ms more work per step (a straggler to find);
* one ~1 GB trace (``make_big_trace.py``, replicas of tests/data/gpu_2rank_nccl_rank0.json.gz).

Then, in fresh processes (the wall time a user waits, interpreter start included), best of
``--repeat``: ``torchprof diagnose --json`` of the 512-rank cycle, and of the 1 GB trace with
``--reparse`` (decoded like ``torchprof summary``'s, with the communication events) beside
``torchprof summary --reparse --json`` of the same trace.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import msgspec  # noqa: E402
from make_big_trace import DEFAULT_SOURCE  # noqa: E402
from make_big_trace import build as build_big  # noqa: E402

from torchprof_args.analysis import load_trace, summarize  # noqa: E402
from torchprof_args.analysis.collect.sidecar import write_sidecar  # noqa: E402
from torchprof_args.analysis.critical_path.reduced import rank_paths  # noqa: E402
from torchprof_args.analysis.diagnose.rank import rank_diagnosis  # noqa: E402
from torchprof_args.analysis.jsonout import finite  # noqa: E402

#: rank 0 of a real 128-rank job (its rank 1 arrives ~180 ms late at an all-to-all: a real straggler,
#: which would hide the one injected here).
SOURCES = [REPO / "tests" / "data" / "gpu_128rank_sampled_rank0.json.gz"]
SLOW_NODE, SLOW_MS = 5, 60.0


def _rank_docs(rank: int, world: int, summary: dict, diagnosis: dict) -> tuple[dict, dict]:
    s, d = copy.deepcopy(summary), copy.deepcopy(diagnosis)
    s.update(rank=rank, world_size=world, host=f"node{rank // 8:03d}")
    d.update(rank=rank, world_size=world)
    if rank // 8 == SLOW_NODE:
        d["steps"] = [dict(st, dur_us=st["dur_us"] + SLOW_MS * 1e3) for st in d["steps"]]
        d["step_mean_us"] += SLOW_MS * 1e3
        s["work_mean_us"] += SLOW_MS * 1e3
    for f in d["findings"]:
        f["ranks"] = [rank]
    return s, d


def build_cycle(out: Path, ranks: int) -> Path:
    cycle = out / f"run{ranks}" / "iter000100-000101"
    marker = cycle / ".complete-v3"  # sidecars with the critical path's graph and the work per step
    if marker.exists():
        return cycle
    cycle.mkdir(parents=True, exist_ok=True)
    real = []
    for source in SOURCES:
        trace = load_trace(source, comms=True, flops=True)
        real.append((source, finite(summarize(trace, top=None)), finite(rank_diagnosis(trace)),
                     msgspec.to_builtins(finite(rank_paths(trace)))))
    for rank in range(ranks):
        source, summary, diagnosis, paths = real[rank % len(real)]
        path = cycle / f"rank{rank:05d}_node{rank // 8:03d}_pid{10000 + rank}.pt.trace.json.gz"
        if not path.exists():
            os.link(source, path)
        s, d = _rank_docs(rank, ranks, summary, diagnosis)
        write_sidecar(path, {"summary": s, "diagnosis": d,
                             "critical_path": dict(copy.deepcopy(paths), rank=rank, world_size=ranks)})
    marker.touch()
    return cycle


def timed(args: list[str]) -> tuple[float, str]:
    """``torchprof ARGS`` in a fresh process: (wall seconds, stdout)."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torchprof_args", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"torchprof {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def best_of(args: list[str], repeat: int) -> tuple[float, str]:
    """The best wall time of ``repeat`` runs of :func:`timed`, and the first run's output."""
    runs = [timed(args) for _ in range(max(repeat, 1))]
    return min(r[0] for r in runs), runs[0][1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--size-mb", type=float, default=1100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "diagnose")
    args = parser.parse_args(argv)
    print(f"CPU: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)

    cycle = build_cycle(args.out, args.ranks)
    wall, out = best_of(["diagnose", str(cycle), "--json", "--no-progress"], args.repeat)
    doc = json.loads(out)
    kinds = ", ".join(f"{f['kind']} ({len(f['ranks'])} ranks)" for f in doc["findings"])
    print(f"diagnose, {doc['ranks']} ranks from sidecars: {wall:.2f} s (target < 5 s); findings: {kinds}")

    big = args.out / f"big{int(args.size_mb)}" / f"bench_{int(args.size_mb)}mb.pt.trace.json"
    if not big.exists():
        big.parent.mkdir(parents=True, exist_ok=True)
        build_big(DEFAULT_SOURCE, big, args.size_mb, False)
    mb = big.stat().st_size / 1e6
    wall, out = best_of(["diagnose", str(big), "--json", "--reparse", "--no-progress"], args.repeat)
    print(f"diagnose, one {mb:,.0f} MB trace without sidecar: {wall:.2f} s, {mb / wall:,.0f} MB/s; "
          f"{len(json.loads(out)['findings'])} findings")
    wall_s, _ = best_of(["summary", str(big), "--json", "--reparse", "--no-progress"], args.repeat)
    print(f"summary, the same trace: {wall_s:.2f} s, {mb / wall_s:,.0f} MB/s "
          f"(diagnose / summary time: {wall / wall_s:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
