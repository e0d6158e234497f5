"""`torchprof summary` on every real trace shape, each replicated to ~1 GB, side by side in one run.

    python benchmarks/bench_shapes.py [--size-mb 1024] [--repeat 3] [--gzip] [SOURCE.json.gz ...]

For each source trace (default: every trace in tests/data: GPU traces with many kernels, GPU
traces with record_shapes, CPU-only traces dominated by CPU operators and Python functions) a
replica of about ``--size-mb`` MB of uncompressed JSON is built once under benchmarks/out/shapes/
(git-ignored) by ``make_big_trace.py``; then the real command ``python -m torchprof_args summary
--json FILE`` runs ``--repeat`` times in a fresh process.  Reported per shape:

* wall seconds (best run) and MB/s of uncompressed JSON; CPU seconds of the process tree;
* peak memory, in one more run (reading /proc every 10 ms slows the command, so the timed runs do
  not sample): the proportional set size (PSS) of the command and its decoding worker, summed
  (pages the forked worker shares with its parent counted once), and as a share of the
  uncompressed size; and the largest RSS of one process;
* the targets: >= 250 MB/s and PSS <= 25 % of the input.

The load average is printed before and after: on a shared machine, read CPU seconds too.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from make_big_trace import build  # noqa: E402

TARGET_MBPS = 250.0
TARGET_MEMORY_SHARE = 0.25


def _pss_mb(root: psutil.Process) -> float:
    """Summed PSS (MB) of ``root`` and its children, 0 for processes already gone."""
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 1e6


def run_once(path: Path, sample: bool = False) -> dict:
    """One ``torchprof summary --json`` of ``path``: wall and CPU time; with ``sample``, the peak
    memory of the process tree (sampling /proc slows the command down: time runs do not sample)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    command = [sys.executable, "-m", "torchprof_args", "summary", "--json", "--no-progress", str(path)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = peak_rss = 0.0
    stop = threading.Event()

    def sample_pss() -> None:
        nonlocal peak, peak_rss
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                peak = max(peak, _pss_mb(root))
                peak_rss = max(peak_rss, root.memory_info().rss / 1e6)
            except psutil.NoSuchProcess:
                return
            stop.wait(0.01)

    sampler = threading.Thread(target=sample_pss, daemon=True)
    if sample:
        sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    stop.set()
    if sample:
        sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"torchprof summary failed on {path}:\n{err.decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "pss_mb": peak, "max_rss_mb": peak_rss}


def replica(source: Path, size_mb: float, out_dir: Path, compress: bool) -> Path:
    """The ~``size_mb`` MB replica of ``source`` (built on first use)."""
    stem = source.name.split(".")[0]
    path = out_dir / f"{stem}_{int(size_mb)}mb.pt.trace.json{'.gz' if compress else ''}"
    if not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        build(source, path, size_mb, compress)
    return path


def uncompressed_mb(path: Path) -> float:
    if path.name.endswith(".gz"):
        sys.path.insert(0, str(REPO))
        from torchprof_args.analysis.decode.reader import TraceStream

        stream = TraceStream(path)
        for _ in stream.batches(lambda text: None):
            pass
        return stream.uncompressed_bytes / 1e6
    return path.stat().st_size / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", type=Path, help="default: every .json.gz trace in tests/data")
    parser.add_argument("--size-mb", type=float, default=1024)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per shape; the fastest wall time is reported")
    parser.add_argument("--gzip", action="store_true", help="measure the .json.gz replicas instead of .json")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "shapes")
    args = parser.parse_args(argv)
    sources = args.sources or sorted((REPO / "tests" / "data").glob("*.json.gz"))
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for source in sources:
        path = replica(source, args.size_mb, args.out, args.gzip)
        mb = uncompressed_mb(path)
        runs = [run_once(path) for _ in range(max(args.repeat, 1))]
        best = min(runs, key=lambda r: r["wall_s"])
        memory = run_once(path, sample=True)
        rows.append((source.name, mb, best, memory["pss_mb"], memory["max_rss_mb"]))
        times = ", ".join(f"{r['wall_s']:.2f} s" for r in runs)
        print(f"{source.name}: {times}", file=sys.stderr, flush=True)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())

    kind = ".json.gz" if args.gzip else ".json"
    print(f"\n`torchprof summary --json` on ~{args.size_mb:.0f} MB replicas ({kind}), {os.cpu_count()} CPUs, "
          f"load average {load_before} at start, {load_after} at end; best of {args.repeat}")
    print(f"{'shape (source trace)':36} {'MB':>6} {'wall s':>7} {'MB/s':>6} {'CPU s':>6} {'peak PSS MB':>11} "
          f"{'PSS/size':>8} {'main RSS MB':>11}  "
          f"targets (>= {TARGET_MBPS:.0f} MB/s, <= {TARGET_MEMORY_SHARE:.0%})")
    for name, mb, best, pss, rss in rows:
        speed = mb / best["wall_s"]
        ok = (("ok" if speed >= TARGET_MBPS else "SLOW") + " / "
              + ("ok" if pss / mb <= TARGET_MEMORY_SHARE else "OVER"))
        print(f"{name:36} {mb:6.0f} {best['wall_s']:7.2f} {speed:6.0f} {best['cpu_s']:6.2f} {pss:11.0f} "
              f"{pss / mb:8.1%} {rss:11.0f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
