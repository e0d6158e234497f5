"""`torchprof mem` on a CUDA memory snapshot of N allocator events: time and memory against the targets.

    python benchmarks/bench_memory.py [--events 1000000] [--repeat 3]

Builds (once, under benchmarks/out/, git-ignored) a snapshot in ``torch.cuda.memory._snapshot()``'s
format whose history holds ``--events`` entries (allocations and frees, stacks of 5-30 frames drawn
from 3,000 distinct ones and shared between entries, as PyTorch's symbolisation shares them:
tests/helpers/snapshots.py), then measures in fresh subprocesses, best of ``--repeat``:

* ours: ``load_snapshot`` (the refusing unpickler, streamed from the file) + ``summarize_snapshot``
  (history to columns, replay, breakdown by category, allocator state), as ``torchprof mem`` runs
  them: wall time and peak RSS;
* the baseline: ``pickle.load`` alone (the C unpickler, trusting the file: no analysis at all).

Targets (issue 28): 1M events in under 10 s and 2 GB.  The load average is printed before and after:
on a shared machine, read the baseline's time beside ours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

OURS = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from torchprof_args.analysis.memory.snapshot import load_snapshot, summarize_snapshot
t0 = time.perf_counter()
snap = load_snapshot(sys.argv[1])
t1 = time.perf_counter()
summary = summarize_snapshot(snap, sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "total_s": t2 - t0, "events": summary.devices[0].history_events,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

BASELINE = r"""
import json, pickle, resource, sys, time
t0 = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    snap = pickle.load(f)
print(json.dumps({"total_s": time.perf_counter() - t0,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(code: str, path: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, str(path), str(REPO)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def _best(code: str, path: Path, repeat: int) -> dict[str, float]:
    runs = [_run(code, path) for _ in range(repeat)]
    return min(runs, key=lambda r: r["total_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from helpers.snapshots import long_history, write

    out = HERE / "out"
    out.mkdir(exist_ok=True)
    path = out / f"snapshot_{args.events}.pickle"
    if not path.exists():
        write(long_history(args.events), path)
    print(f"load average before: {os.getloadavg()[0]:.2f}; snapshot {path.stat().st_size / 1e6:.1f} MB, "
          f"{args.events:,} history events")
    ours = _best(OURS, path, args.repeat)
    base = _best(BASELINE, path, args.repeat)
    print(f"{'':<34}{'wall s':>10}{'peak RSS MB':>14}")
    print(f"{'pickle.load alone (baseline)':<34}{base['total_s']:>10.2f}{base['rss_mb']:>14.0f}")
    print(f"{'torchprof mem (load + analysis)':<34}{ours['total_s']:>10.2f}{ours['rss_mb']:>14.0f}")
    print(f"{'  of which load_snapshot':<34}{ours['load_s']:>10.2f}")
    print(f"{'ratio ours / baseline':<34}{ours['total_s'] / base['total_s']:>10.2f}"
          f"{ours['rss_mb'] / base['rss_mb']:>14.2f}")
    ok = ours["total_s"] < 10 and ours["rss_mb"] < 2048
    print(f"target (1M events: < 10 s, < 2048 MB): {'met' if ok else 'NOT met'} "
          f"({ours['events']:,} events read)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
