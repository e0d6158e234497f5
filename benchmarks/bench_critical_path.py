"""The cross-rank critical path of a 512-rank cycle from its sidecars (target: < 10 s), with what-ifs,
beside `torchprof diagnose` (its savings computed on the same graph) of the same cycle.

    python benchmarks/bench_critical_path.py [--ranks 512] [--repeat 3]

Builds once, under benchmarks/out/critical_path/ (git-ignored), one cycle of a 512-rank job in the
profiler's layout: each rank's trace a hard link to rank 0 of the 128-rank job in tests/data,
each rank's sidecar that trace's real summary, per-rank diagnosis and reduced dependency graph
(``rank_paths``), renumbered to its rank, with one node (8 ranks) doing 60 ms more work before every
collective and every step's end (a straggler the path must run through).  Then, in fresh processes
(the wall time a user waits, interpreter start included), best of ``--repeat``: ``torchprof
critical-path --json`` with two what-ifs, and ``torchprof diagnose --json``.  Prints the times, the
ranks the path runs through and the what-ifs' answers (the slow node like the median saves about 60
ms per step).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import msgspec  # noqa: E402
from bench_diagnose import best_of  # noqa: E402

from torchprof_args.analysis import load_trace, summarize  # noqa: E402
from torchprof_args.analysis.collect.sidecar import write_sidecar  # noqa: E402
from torchprof_args.analysis.critical_path.reduced import rank_paths  # noqa: E402
from torchprof_args.analysis.diagnose.rank import rank_diagnosis  # noqa: E402
from torchprof_args.analysis.jsonout import finite  # noqa: E402

#: rank 0 of a real 128-rank job (its ranks 0 and 1 in tests/data disagree on the order of their
#: collectives in one step, so every synthetic rank is rank 0).
SOURCES = [REPO / "tests" / "data" / "gpu_128rank_sampled_rank0.json.gz"]
SLOW_NODE, SLOW_MS = 5, 60.0


def _slower(paths: dict, extra_us: float) -> dict:
    """A rank's reduced graph with ``extra_us`` more work on every path into its sinks (its host is
    slower before every collective and every step's end)."""
    out = copy.deepcopy(paths)
    for table in [*out["arrivals"].values(), *out["step_ends"].values()]:
        for i, row in enumerate(table):
            if row is not None:
                label1, d1, label2, d2, w1, w2 = row
                table[i] = [label1, d1 + extra_us, label2, d2 + extra_us if label2 != -2 else d2,
                            w1 + extra_us, w2 + extra_us if label2 != -2 else w2]
    return out


def build_cycle(out: Path, ranks: int) -> Path:
    cycle = out / f"run{ranks}" / "iter000100-000101"
    marker = cycle / ".complete-v2"  # sidecars with the summary's work per step
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
        s, d, p = copy.deepcopy(summary), copy.deepcopy(diagnosis), copy.deepcopy(paths)
        s.update(rank=rank, world_size=ranks, host=f"node{rank // 8:03d}")
        d.update(rank=rank, world_size=ranks)
        p.update(rank=rank, world_size=ranks)
        for f in d["findings"]:
            f["ranks"] = [rank]
        if rank // 8 == SLOW_NODE:
            p = _slower(p, SLOW_MS * 1e3)
            d["steps"] = [dict(st, dur_us=st["dur_us"] + SLOW_MS * 1e3, work_us=st["work_us"] + SLOW_MS * 1e3)
                          for st in d["steps"]]
            d["step_mean_us"] += SLOW_MS * 1e3
            s["work_mean_us"] += SLOW_MS * 1e3
        write_sidecar(path, {"summary": s, "diagnosis": d, "critical_path": p})
    marker.touch()
    return cycle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "critical_path")
    args = parser.parse_args(argv)
    print(f"CPU: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}", flush=True)
    cycle = build_cycle(args.out, args.ranks)
    slow = ",".join(str(r) for r in range(SLOW_NODE * 8, SLOW_NODE * 8 + 8))
    wall, out = best_of(["critical-path", str(cycle), "--json", "--no-progress",
                       "--what-if", f"ranks {slow} like the median", "--what-if", "no launch gaps"],
                      args.repeat)
    doc = json.loads(out)
    on_path = sorted({int(r) for s in doc["steps"] for r in s["by_rank"]})
    print(f"critical-path, {doc['ranks']} ranks from sidecars, 2 what-ifs: {wall:.2f} s (target < 10 s); "
          f"step {doc['step_ms']:.1f} ms; the path runs through ranks {on_path}")
    for answer in doc["what_if"]:
        print(f"  what if {answer['spec'][:60]}: saves {answer['saving_ms_per_step']} ms/step")
    wall, out = best_of(["diagnose", str(cycle), "--json", "--no-progress"], args.repeat)
    found = json.loads(out)
    kinds = ", ".join(f"{f['kind']} {f['saving_ms_per_step']:.1f} ms (bound {f['bound_ms_per_step']:.1f}, "
                      f"{f['saving_basis']})" for f in found["findings"][:4])
    print(f"diagnose, {found['ranks']} ranks from sidecars, savings on the graph: {wall:.2f} s; {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
