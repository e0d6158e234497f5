"""`torchprof summary` and `diagnose` on every real trace shape, each replicated to ~1 GB, side by side.

    python benchmarks/bench_shapes.py [--size-mb 1024] [--repeat 3] [--gzip] [--all-cores]
        [--commands summary diagnose] [--decoders c python] [SOURCE ...]

For each source trace (default: every trace in tests/data: GPU traces with many kernels, GPU
traces with record_shapes, CPU-only traces dominated by CPU operators and Python functions, the
CPU-heavy shape of tests/jobs/cpu_heavy_job.py: many short operators with shapes and stacks and
many collectives) a replica of about ``--size-mb`` MB of uncompressed JSON is built once under
benchmarks/out/shapes/ (git-ignored) by ``make_big_trace.py`` (the source's steps again and again:
no data copied from elsewhere); then the real commands ``python -m torchprof_args summary --json
FILE`` and ``diagnose --json FILE`` (no sidecar: parsed) run ``--repeat`` times each in a fresh
process, pinned to one core unless ``--all-cores``, with each decoder of ``--decoders``: ``c``, the
package's C extensions (the decoder in every mode these commands use, the critical path's replay), and
``python``, their fallbacks alone (``TORCHPROF_PURE_PYTHON=1``: msgspec, numba), side by side.
Reported per shape, command and decoder:

* wall seconds (best run) and MB/s of uncompressed JSON; CPU seconds of the process tree;
* peak memory, in one more run (reading /proc every 10 ms slows the command, so the timed runs do
  not sample): the proportional set size (PSS) of the command and its decoding worker, summed
  (pages the forked worker shares with its parent counted once), and as a share of the
  uncompressed size; and the largest RSS of one process;
* beside them the floor of this design on the same core: the bare decompression (``.json.gz``) and
  JSON tokenisation of the same bytes (msgspec over the whole document, each event left raw);
* the targets: >= 300 MB/s and PSS <= 25 % of the input.

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
sys.path.insert(0, str(REPO))

from make_big_trace import build  # noqa: E402

from torchprof_args.analysis.decode.columns import fast_decoder  # noqa: E402
from torchprof_args.analysis.extensions import PURE_PYTHON_ENV  # noqa: E402

TARGET_MBPS = 300.0
COMMANDS = ("summary", "diagnose")
#: the decoders compared: the C extension (where built and the mode has it), the msgspec path alone
DECODERS = {"c": {}, "python": {PURE_PYTHON_ENV: "1"}}
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


def run_once(path: Path, sample: bool = False, command_name: str = "summary", cores: set[int] | None = None,
             decoder: str = "c") -> dict:
    """One ``torchprof <command_name> --json`` of ``path`` (on ``cores``, with ``decoder``): wall and
    CPU time; with ``sample``, the peak memory of the process tree (sampling /proc slows the command
    down: time runs do not sample)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **DECODERS[decoder]}
    if decoder == "c":
        env.pop(PURE_PYTHON_ENV, None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    command = [sys.executable, "-m", "torchprof_args", command_name, "--json", "--no-progress",
               str(path.resolve())]
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    # cwd: ``python -m`` puts the working directory before PYTHONPATH, so from another checkout's
    # root its code would be measured, not this one's.
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            preexec_fn=pin, cwd=REPO)
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
        raise SystemExit(f"torchprof {command_name} failed on {path}:\n{err.decode()[-2000:]}")
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


def floor_seconds(path: Path, cores: set[int] | None) -> float:
    """The floor of this design for ``path``: decompressing it (``.json.gz``: isal where installed, as
    the reader does) and tokenising every byte of its JSON (msgspec, each event kept raw), on
    ``cores``: a fresh process, best of two."""
    code = ("import sys, time, msgspec\n"
            "from torchprof_args.analysis.decode.reader import open_gzip\n"
            "class Doc(msgspec.Struct):\n"
            "    traceEvents: list[msgspec.Raw]\n"  # every other key skipped: tokenised, not kept
            "p = sys.argv[1]; t = time.perf_counter()\n"
            "data = open_gzip(p).read() if p.endswith('.gz') else open(p, 'rb').read()\n"
            "msgspec.json.Decoder(Doc).decode(data)\n"
            "print(time.perf_counter() - t)\n")
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    best = float("inf")
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code, str(path.resolve())], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                             preexec_fn=pin, cwd=REPO)
        best = min(best, float(out.stdout))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", type=Path, help="default: every .json.gz trace in tests/data")
    parser.add_argument("--size-mb", type=float, default=1024)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per shape; the fastest wall time is reported")
    parser.add_argument("--gzip", action="store_true", help="measure the .json.gz replicas instead of .json")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "shapes")
    parser.add_argument("--all-cores", action="store_true", help="do not pin the commands to one core")
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    parser.add_argument("--decoders", nargs="+", choices=list(DECODERS), default=list(DECODERS),
                        help="c: the C extension where the mode has it; python: the msgspec path alone")
    args = parser.parse_args(argv)
    if "c" in args.decoders and fast_decoder() is None:
        print("the C extension is not built (python setup.py build_ext --inplace): 'c' runs the msgspec "
              "path", file=sys.stderr)
    sources = args.sources or sorted((REPO / "tests" / "data").glob("*.json.gz"))
    cores = None if args.all_cores else {sorted(os.sched_getaffinity(0))[-1]}
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for source in sources:
        path = replica(source, args.size_mb, args.out, args.gzip)
        mb = uncompressed_mb(path)
        floor = floor_seconds(path, cores)
        for command in args.commands:
            runs: dict[str, list[dict]] = {d: [] for d in args.decoders}
            for _ in range(max(args.repeat, 1)):  # the decoders interleaved
                for decoder in args.decoders:
                    runs[decoder].append(run_once(path, command_name=command, cores=cores, decoder=decoder))
            for decoder in args.decoders:
                best = min(runs[decoder], key=lambda r: r["wall_s"])
                memory = run_once(path, sample=True, command_name=command, cores=cores, decoder=decoder)
                rows.append((source.name, command, decoder, mb, best, memory["pss_mb"], memory["max_rss_mb"],
                             floor))
                times = ", ".join(f"{r['wall_s']:.2f} s" for r in runs[decoder])
                print(f"{source.name} {command} {decoder}: {times} (floor {floor:.2f} s)", file=sys.stderr,
                      flush=True)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())

    kind = ".json.gz" if args.gzip else ".json"
    where = "all cores" if cores is None else f"one core (CPU {next(iter(cores))})"
    print(f"\n`torchprof summary | diagnose --json` on ~{args.size_mb:.0f} MB replicas ({kind}), {where} "
          f"of {os.cpu_count()}, load average {load_before} at start, {load_after} at end; "
          f"best of {args.repeat}")
    print(f"{'shape (source trace)':36} {'command':8} {'decoder':7} {'MB':>6} {'wall s':>7} {'MB/s':>6} "
          f"{'CPU s':>6} "
          f"{'peak PSS MB':>11} {'PSS/size':>8} {'main RSS MB':>11} {'floor s':>7} {'floor MB/s':>10}  "
          f"targets (>= {TARGET_MBPS:.0f} MB/s, <= {TARGET_MEMORY_SHARE:.0%})")
    for name, command, decoder, mb, best, pss, rss, floor in rows:
        speed = mb / best["wall_s"]
        ok = (("ok" if speed >= TARGET_MBPS else "SLOW") + " / "
              + ("ok" if pss / mb <= TARGET_MEMORY_SHARE else "OVER"))
        print(f"{name:36} {command:8} {decoder:7} {mb:6.0f} {best['wall_s']:7.2f} {speed:6.0f} "
              f"{best['cpu_s']:6.2f} "
              f"{pss:11.0f} {pss / mb:8.1%} {rss:11.0f} {floor:7.2f} {mb / floor:10.0f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
