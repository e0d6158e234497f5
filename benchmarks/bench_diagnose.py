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
``torchprof summary --reparse --json`` of the same trace: with the package's C extensions, then with
``TORCHPROF_PURE_PYTHON=1`` (their Python fallbacks), with each one's peak RSS, and whether the outputs
are the same.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
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
from torchprof_args.analysis.extensions import PURE_PYTHON_ENV  # noqa: E402
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


def timed(args: list[str], pure_python: bool = False) -> tuple[float, str, float]:
    """``torchprof ARGS`` in a fresh process: (wall seconds, stdout, peak RSS in MB); ``pure_python``:
    with ``TORCHPROF_PURE_PYTHON=1`` (no C extension)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), PURE_PYTHON_ENV: "1" if pure_python else "0"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "torchprof_args", *args], stdout=out, stderr=err,
                                env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"torchprof {' '.join(args)} failed:\n{err.read()[-3000:]}")
        return wall, out.read(), usage.ru_maxrss / 1024


def best_of(args: list[str], repeat: int, pure_python: bool = False) -> tuple[float, str, float]:
    """The best wall time of ``repeat`` runs of :func:`timed`, the first run's output, the peak RSS."""
    runs = [timed(args, pure_python) for _ in range(max(repeat, 1))]
    return min(r[0] for r in runs), runs[0][1], max(r[2] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--size-mb", type=float, default=1100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "diagnose")
    args = parser.parse_args(argv)
    print(f"CPU: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)

    cycle = build_cycle(args.out, args.ranks)
    wall, out, _ = best_of(["diagnose", str(cycle), "--json", "--no-progress"], args.repeat)
    doc = json.loads(out)
    kinds = ", ".join(f"{f['kind']} ({len(f['ranks'])} ranks)" for f in doc["findings"])
    print(f"diagnose, {doc['ranks']} ranks from sidecars: {wall:.2f} s (target < 5 s); findings: {kinds}")

    big = args.out / f"big{int(args.size_mb)}" / f"bench_{int(args.size_mb)}mb.pt.trace.json"
    if not big.exists():
        big.parent.mkdir(parents=True, exist_ok=True)
        build_big(DEFAULT_SOURCE, big, args.size_mb, False)
    mb = big.stat().st_size / 1e6
    print(f"one {mb:,.0f} MB trace without sidecar (--reparse), best of {args.repeat}; the package's C "
          f"extensions, then {PURE_PYTHON_ENV}=1 (the Python fallbacks):")
    print(f"  {'command':<10} {'code':<7} {'s':>7} {'MB/s':>6} {'peak MB':>8} {'% of file':>9}")
    walls: dict[tuple[str, bool], float] = {}
    outputs: dict[tuple[str, bool], str] = {}
    for pure in (False, True):
        for command in ("summary", "diagnose"):
            command_line = [command, str(big), "--json", "--reparse", "--no-progress"]
            wall, out, peak = best_of(command_line, args.repeat, pure)
            walls[command, pure], outputs[command, pure] = wall, out
            code = "python" if pure else "C"
            share = 100 * peak / mb
            print(f"  {command:<10} {code:<7} {wall:7.2f} {mb / wall:6,.0f} {peak:8,.0f} {share:8.0f}%",
                  flush=True)
    for pure in (False, True):
        print(f"diagnose / summary time, {'Python' if pure else 'C'}: "
              f"{walls['diagnose', pure] / walls['summary', pure]:.2f} (target <= 1.5)")
    same = all(outputs[c, False] == outputs[c, True] for c in ("summary", "diagnose"))
    print(f"same output with and without the C extensions: {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
