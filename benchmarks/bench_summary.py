"""`torchprof summary` vs HTA on a replicated multi-GB trace, side by side in one run.

    python benchmarks/bench_summary.py [--size-mb 1100] [--hta-size-mb 1100] [--gzip]

Builds (once) a trace by replicating the steps of a real trace from shared/traces, then measures
in fresh subprocesses: our load + summarize (MB/s of uncompressed JSON, peak RSS) and HTA's
``TraceAnalysis`` load + temporal breakdown + comm/comp overlap + kernel-type breakdown (the same
analyses).  With ``--hta-size-mb`` smaller than ``--size-mb`` HTA runs on a smaller replica and its
time is extrapolated linearly (said so in the output).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from make_big_trace import build  # noqa: E402

OURS = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from torchprof_args.analysis import load_trace, summarize
t0 = time.perf_counter()
trace = load_trace(sys.argv[1], workers=int(sys.argv[3]))
t1 = time.perf_counter()
s = summarize(trace)
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "total_s": t2 - t0, "bytes": trace.uncompressed_bytes,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "idle_pct": s["gpu"]["idle_pct"], "overlap_pct": s["gpu"]["comm_comp_overlap_pct"]}))
"""

HTA = r"""
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
import warnings; warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "total_s": t2 - t0,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "idle_pct": float(tb["idle_time_pctg"].iloc[0]), "overlap_pct": float(ov["comp_comm_overlap_pctg"].iloc[0])}))
"""


def _run(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark subprocess failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _trace(out_dir: Path, size_mb: float, compress: bool) -> Path:
    name = f"bench_{int(size_mb)}mb.pt.trace.json" + (".gz" if compress else "")
    path = out_dir / f"{int(size_mb)}mb{'_gz' if compress else ''}" / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build(REPO.parent / "shared" / "traces" / "gpu_2rank_nccl_rank0.json.gz"
              if (REPO.parent / "shared").is_dir() else Path("/work/shared/traces/gpu_2rank_nccl_rank0.json.gz"),
              path, size_mb, compress)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=1100)
    parser.add_argument("--hta-size-mb", type=float, default=None, help="default: same as --size-mb")
    parser.add_argument("--gzip", action="store_true", help="also measure the .json.gz form")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    hta_mb = args.hta_size_mb or args.size_mb

    big = _trace(args.out, args.size_mb, False)
    ours = _run(OURS, str(big), str(REPO), str(args.workers))
    mb = ours["bytes"] / 1e6
    rows = [("torchprof summary (.json)", mb, ours)]
    if args.gzip:
        gz = _trace(args.out, args.size_mb, True)
        rows.append(("torchprof summary (.json.gz)", mb, _run(OURS, str(gz), str(REPO), str(args.workers))))
    small = big if hta_mb == args.size_mb else _trace(args.out, hta_mb, False)
    hta = _run(HTA, str(small.parent))
    hta_bytes = small.stat().st_size / 1e6
    scale = mb / hta_bytes
    hta_total = hta["total_s"] * scale
    note = "" if small == big else f" (ran on {hta_bytes:.0f} MB, time x{scale:.2f} extrapolated)"
    rows.append((f"HTA load + 3 analyses{note}", mb, {**hta, "total_s": hta_total}))

    print(f"\ninput: {mb:,.0f} MB of uncompressed JSON ({big})")
    print(f"{'':52} {'total s':>9} {'MB/s':>8} {'peak RSS MB':>12} {'RSS/size':>9} {'idle %':>7} {'overlap %':>9}")
    for label, size, r in rows:
        print(f"{label:52} {r['total_s']:9.2f} {size / r['total_s']:8.1f} {r['rss_mb']:12.0f} "
              f"{r['rss_mb'] / (hta_bytes if label.startswith('HTA') else size):9.2%} {r['idle_pct']:7.2f} {r['overlap_pct']:9.2f}")
    print(f"\nspeed-up vs HTA: {hta_total / ours['total_s']:.1f}x (load only {ours['load_s']:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
