"""``make gpu-check``: the GPU tests and the GPU benchmarks in one command, one markdown table.

Sections (``--sections``, default all of them):

  tests       pytest on tests/gpu, plus the fast tests of the suite files with CUDA paths
              (test_nsys, test_memory_snapshot, test_profiler_hooks, test_timers, test_profiler)
  analysis    two short traced jobs (clean; slow loader + loss.item()): summary and analyzers vs
              HTA, and `torchprof diagnose` finds the injected problems (gpu_check_analysis.py)
  stall       flush stall on a ~1B-parameter GPT (integrations/demo's model, bf16, sequence 2048):
              stock tensorboard_trace_handler(use_gzip=True) vs prof.stop() alone (floor) vs
              TorchProfiler, with 1 and 3 active steps
  fork        os.fork() time with 20 and 60 GB of host tensors, pageable and pinned (cudaHostRegister,
              and torch's pin_memory=True)
  timers      cost per start/stop pair: host timer, CUDA-event timer, --timing-synchronize timer
  snapshot    memory snapshot dump time with python stacks and with all (C++) stacks
  memory      torchprof mem on snapshots of this GPU: a real OOM of the ~1B GPT explained,
              fragmentation with and without expandable_segments, a 1M-event history read back,
              small snapshots for tests/data (gpu_check_memory.py)
  trace-size  trace MB per iteration with each profiler option alone

Results go to ``--out`` (default benchmarks/out/gpu-check-<time>) as results.json and results.md,
and the table is printed.  Without CUDA it says so in one line and exits 0; ``--smoke`` runs every
section on CPU at toy sizes (seconds), to keep the script's plumbing working.  Exit status 1 when a
test failed or a benchmark raised.

    python benchmarks/gpu_check.py [--smoke] [--out DIR] [--sections tests stall ...]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import gzip
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from torchprof_args import TorchProfiler, add_torch_profile_args  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_check_analysis import section_analysis  # noqa: E402
from gpu_check_memory import section_memory  # noqa: E402
from gpu_workload import (  # noqa: E402
    Row,
    Settings,
    Workload,
    activities,
    demo_model_module,
    settings,
    timed_steps,
)

SECTIONS = ("tests", "analysis", "timers", "snapshot", "memory", "fork", "trace-size", "stall")
#: Suite files whose fast tests take CUDA paths on a GPU host (run with -m "gpu or not slow").
CUDA_CAPABLE_SUITE = (
    "test_nsys.py",
    "test_memory_snapshot.py",
    "test_profiler_hooks.py",
    "test_timers.py",
    "test_profiler.py",
)
OPTIONS = ("record_shapes", "with_stack", "profile_memory", "with_flops", "with_modules")
STALL_OPTIONS = ("record_shapes", "profile_memory", "with_stack")


# -- tests -------------------------------------------------------------------------------------


def section_tests(s: Settings, out: Path, smoke: bool) -> list[Row]:
    """pytest on tests/gpu (and the CUDA-capable suite files); one row per GPU test, one for the rest."""
    xml = out / "pytest.xml"
    paths = ["tests/gpu"] + ([] if smoke else [f"tests/{name}" for name in CUDA_CAPABLE_SUITE])
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-rs",
        "-m",
        "gpu or not slow",
        f"--junitxml={xml}",
        *paths,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    started = time.monotonic()
    try:
        run = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=s.tests_timeout
        )
    except subprocess.TimeoutExpired as err:
        (out / "pytest.log").write_text(
            (err.stdout or b"").decode(errors="replace")
            if isinstance(err.stdout, bytes)
            else err.stdout or ""
        )
        return [Row("tests", "pytest", " ".join(paths), f"TIMED OUT after {s.tests_timeout:.0f} s", ok=False)]
    (out / "pytest.log").write_text(run.stdout + run.stderr)
    if not xml.exists():
        return [
            Row(
                "tests",
                "pytest",
                " ".join(paths),
                f"exit {run.returncode}, no report",
                (run.stdout + run.stderr)[-300:].replace("\n", " "),
                ok=False,
            )
        ]
    rows, suite = [], {"passed": 0, "skipped": 0, "failed": []}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        seconds = float(case.get("time") or 0)
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            outcome, note = "FAILED", (problem.get("message") or "")[:200]
        elif skipped is not None:
            outcome, note = "skipped", (skipped.get("message") or "")[:200]
        else:
            outcome, note = "passed", ""
        if "gpu." in case.get("classname", "") or "tests.gpu" in case.get("classname", ""):
            rows.append(
                Row("tests", name, "", f"{outcome} ({seconds:.1f} s)", note, seconds, outcome != "FAILED")
            )
        elif outcome == "FAILED":
            suite["failed"].append(name)
        else:
            suite[outcome] += 1
    if not smoke:
        failed = suite["failed"]
        rows.append(
            Row(
                "tests",
                "suite files with CUDA paths",
                ", ".join(CUDA_CAPABLE_SUITE),
                f"{suite['passed']} passed, {suite['skipped']} skipped, {len(failed)} failed",
                ("failed: " + ", ".join(failed))[:300] if failed else "",
                ok=not failed,
            )
        )
    rows.append(
        Row(
            "tests",
            "pytest run",
            "",
            f"exit {run.returncode} in {time.monotonic() - started:.0f} s",
            "log: pytest.log, report: pytest.xml",
            ok=run.returncode in (0, 5),
        )
    )
    return rows


# -- flush stall -------------------------------------------------------------------------------


def section_stall(s: Settings, out: Path) -> list[Row]:
    """Flush-step time minus the median of 3 unprofiled steps before the window, per mode."""
    work = Workload(s)
    timed_steps(work, 3)
    with tempfile.TemporaryDirectory(dir=out) as scratch:  # first profiled window: CUPTI's start-up
        stock_window(work, Path(scratch), 1, "floor")
    results: dict[tuple[int, str], list[float]] = {}
    sizes: dict[int, float] = {}
    for _ in range(s.repeats):
        for active in (1, 3):
            for mode in ("stock", "floor", "torchprof"):
                baseline = statistics.median(timed_steps(work, 3))
                with tempfile.TemporaryDirectory(dir=out) as scratch:
                    flush, trace_mb = (
                        torchprof_window(work, Path(scratch), active)
                        if mode == "torchprof"
                        else stock_window(work, Path(scratch), active, mode)
                    )
                results.setdefault((active, mode), []).append(flush - baseline)
                if mode == "stock":
                    sizes[active] = trace_mb
    rows = []
    options = ", ".join(STALL_OPTIONS)
    for active in (1, 3):
        stock = statistics.median(results[(active, "stock")])
        for mode in ("stock", "floor", "torchprof"):
            stall = statistics.median(results[(active, mode)])
            ratio = f"{stall / stock:.2f} x stock" if stock > 0 else ""
            note = f"stock trace {sizes[active]:.1f} MB gz; {options}" if mode == "stock" else ratio
            rows.append(
                Row(
                    "stall",
                    f"flush stall, {mode}",
                    f"{active} active; {s.model}",
                    f"{stall:.2f} s",
                    note,
                    stall,
                )
            )
    return rows


def stock_window(work: Workload, directory: Path, active: int, mode: str) -> tuple[float, float]:
    """One window of torch.profiler: ``stock`` exports with the tensorboard handler, ``floor`` does
    nothing (stop() alone).  Returns the flush step's seconds and the trace's MB."""
    handler = (
        torch.profiler.tensorboard_trace_handler(str(directory), use_gzip=True)
        if mode == "stock"
        else (lambda _prof: None)
    )
    profiler = torch.profiler.profile(
        activities=activities(work.s),
        on_trace_ready=handler,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=active, repeat=1),
        **{option: True for option in STALL_OPTIONS},
    )
    profiler.start()
    times = timed_steps(work, active + 2, lambda _i: profiler.step())
    profiler.stop()
    return times[active], sum(p.stat().st_size for p in directory.rglob("*.gz")) / 1e6


def torchprof_window(work: Workload, directory: Path, active: int) -> tuple[float, float]:
    """The same window through TorchProfiler (fork export, fence, publisher); the exit wait for
    the publisher is not part of any step."""
    flags = [
        "--torch-profile",
        "--torch-profile-dir",
        str(directory),
        "--torch-profile-skip-first",
        "0",
        "--torch-profile-warmup",
        "1",
        "--torch-profile-active",
        str(active),
    ]
    flags += [f"--torch-profile-{option.replace('_', '-')}" for option in STALL_OPTIONS]
    prof = TorchProfiler.from_args(add_torch_profile_args(argparse.ArgumentParser()).parse_args(flags))
    with prof:
        times = timed_steps(work, active + 2, lambda i: prof.step(i + 1))
    published = prof.published_traces
    if len(published) != 1:
        raise RuntimeError(f"TorchProfiler published {len(published)} traces, expected 1")
    return times[active], os.path.getsize(published[0]) / 1e6


# -- fork --------------------------------------------------------------------------------------


def section_fork(s: Settings, out: Path) -> list[Row]:
    """Best of 3 ``os.fork()`` calls (parent side) with each size of touched host tensor alive."""
    from torchprof_args.capture.runtime.host_resources import HostMemoryProbe

    rows = [Row("fork", "os.fork()", "no large tensor", f"{fork_seconds() * 1e3:.1f} ms", "", fork_seconds())]
    for kind in HOST_MEMORY_KINDS if s.device == "cuda" else HOST_MEMORY_KINDS[:1]:
        for requested in s.fork_gb:
            free_gb = HostMemoryProbe().free().free_bytes / 1e9
            gb = min(requested, max(0.0, 0.7 * free_gb - 2))
            clamp = f"clamped from {requested:g} GB ({free_gb:.0f} GB free)" if gb < requested else ""
            if gb < 0.01:
                rows.append(Row("fork", f"os.fork(), {kind}", f"{requested:g} GB", "skipped", clamp))
                continue
            with host_tensor(int(gb * 1e9), kind) as (alloc_seconds, _):
                pinned = pinned_kb()
                seconds = fork_seconds()
            notes = [clamp, f"allocated and touched in {alloc_seconds:.1f} s", pinned]
            rows.append(
                Row(
                    "fork",
                    f"os.fork(), {kind}",
                    f"{gb:.3g} GB host tensor",
                    f"{seconds * 1e3:.1f} ms",
                    "; ".join(filter(None, notes)),
                    seconds,
                )
            )
    return rows


#: pageable (plain), registered in place with cudaHostRegister (what
#: PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True does), and pin_memory=True
#: (torch's caching host allocator: cudaHostAlloc).
HOST_MEMORY_KINDS = ("pageable", "pinned, cudaHostRegister", "pinned, pin_memory=True")


def pinned_kb() -> str:
    """What the kernel counts as pinned / locked in this process (``VmPin``, ``VmLck``)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return ""
    wanted = [line.split(":", 1) for line in lines if line.startswith(("VmPin", "VmLck"))]
    return ", ".join(f"{key} {value.strip()}" for key, value in wanted)


@contextlib.contextmanager
def host_tensor(size: int, kind: str) -> Iterator[tuple[float, torch.Tensor]]:
    """A host tensor of ``size`` bytes of :data:`HOST_MEMORY_KINDS` ``kind``, every page touched."""
    started = time.perf_counter()
    tensor = torch.empty(size, dtype=torch.uint8, pin_memory=kind.endswith("pin_memory=True"))
    tensor.fill_(1)
    cudart = torch.cuda.cudart() if kind.endswith("cudaHostRegister") else None
    if cudart is not None:
        error = int(cudart.cudaHostRegister(tensor.data_ptr(), size, 0))
        if error:
            raise RuntimeError(f"cudaHostRegister of {size / 1e9:.1f} GB failed with CUDA error {error}")
    try:
        yield time.perf_counter() - started, tensor
    finally:
        if cudart is not None:
            cudart.cudaHostUnregister(tensor.data_ptr())
        del tensor


def fork_seconds(tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        best = min(best, time.perf_counter() - started)
        os.waitpid(pid, 0)
    return best


# -- timers ------------------------------------------------------------------------------------


def section_timers(s: Settings, out: Path) -> list[Row]:
    """Nanoseconds per start/stop pair on an idle device, and per read of 100 pairs."""
    from torchprof_args.capture.metrics.timers import Timers

    kinds = [("host timer", "cpu", False)]
    if s.device == "cuda":
        kinds += [("CUDA-event timer", "cuda", False), ("--timing-synchronize timer", "cuda", True)]
    rows = []
    for label, device, synchronize in kinds:
        timer = Timers(0, "minmax", device=device, synchronize=synchronize)("t", log_level=0)
        pairs = s.timer_pairs if not synchronize else max(100, s.timer_pairs // 20)
        best, read = float("inf"), float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(pairs):
                timer.start()
                timer.stop()
            best = min(best, (time.perf_counter() - started) / pairs)
            started = time.perf_counter()
            timer.elapsed()
            read = min(read, time.perf_counter() - started)
        rows.append(
            Row(
                "timers",
                f"start/stop pair, {label}",
                f"{pairs} pairs, best of 3",
                f"{best * 1e9:,.0f} ns",
                f"reading {pairs} pairs: {read * 1e6:,.0f} us",
                best,
            )
        )
    if s.device != "cuda":
        rows.append(Row("timers", "CUDA-event and synchronizing timers", "", "n/a", "needs CUDA"))
    return rows


# -- memory snapshots --------------------------------------------------------------------------


def section_snapshot(s: Settings, out: Path, args: argparse.Namespace) -> list[Row]:
    """Each stack mode in a fresh process (clean allocator history), bounded by --snapshot-timeout."""
    if s.device != "cuda":
        return [Row("snapshot", "memory snapshot dump", "python / all stacks", "n/a", "needs CUDA")]
    rows = []
    for stacks in ("python", "all"):
        command = [
            sys.executable,
            __file__,
            "--worker",
            "snapshot",
            "--stacks",
            stacks,
            "--out",
            str(out),
            *model_flags(args),
        ]
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=s.snapshot_timeout)
        except subprocess.TimeoutExpired:
            rows.append(
                Row(
                    "snapshot",
                    "memory snapshot dump",
                    f"{stacks} stacks",
                    f"> {s.snapshot_timeout:.0f} s",
                    "timed out (model build, 3 steps and the dump)",
                    None,
                )
            )
            continue
        if run.returncode != 0:
            raise RuntimeError(f"snapshot worker ({stacks}) failed: {run.stderr[-500:]}")
        found = json.loads(run.stdout.strip().splitlines()[-1])
        rows.append(
            Row(
                "snapshot",
                "memory snapshot dump",
                f"{stacks} stacks",
                f"{found['seconds']:.2f} s",
                f"{found['mb']:.1f} MB pickle, {found['events']:,} events; {s.model}",
                found["seconds"],
            )
        )
    return rows


def snapshot_worker(args: argparse.Namespace) -> int:
    """Record 3 steps' allocator history with ``--stacks``, time one dump; print one JSON line."""
    from torchprof_args.capture.runtime.config import MemorySnapshotConfig
    from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter

    s = settings(args)
    with tempfile.TemporaryDirectory(dir=args.out) as scratch:
        snap = MemorySnapshotter(
            MemorySnapshotConfig(enabled=True, output_dir=scratch, stacks=args.stacks), rank=0, host="bench"
        )
        with snap.session():
            work = Workload(s)
            timed_steps(work, 3)
            snapshot = torch.cuda.memory._snapshot()
            events = sum(len(trace) for trace in snapshot.get("device_traces", []))
            del snapshot
            started = time.perf_counter()
            path = snap.dump(3)
            seconds = time.perf_counter() - started
        if path is None:
            raise RuntimeError("the snapshotter wrote nothing (see its log)")
        print(json.dumps({"seconds": seconds, "mb": os.path.getsize(path) / 1e6, "events": events}))
    return 0


# -- trace size --------------------------------------------------------------------------------


def section_trace_size(s: Settings, out: Path) -> list[Row]:
    """Uncompressed trace MB per recorded iteration (2 active steps) with no option, then each alone."""
    work = Workload(s)
    timed_steps(work, 2)
    rows = []
    for option in ("none", *OPTIONS):
        with tempfile.TemporaryDirectory(dir=out) as scratch:
            path = Path(scratch) / "trace.json"
            profiler = torch.profiler.profile(
                activities=activities(s),
                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
                on_trace_ready=lambda prof, target=path: prof.export_chrome_trace(str(target)),
                **({} if option == "none" else {option: True}),
            )
            profiler.start()
            timed_steps(work, 3, lambda _i, profiler=profiler: profiler.step())
            profiler.stop()
            mb = path.stat().st_size / 1e6 / 2
            gz = len(gzip.compress(path.read_bytes(), compresslevel=1)) / 1e6 / 2
        rows.append(
            Row(
                "trace-size",
                "trace MB per iteration",
                option,
                f"{mb:.2f} MB",
                f"{gz:.2f} MB gzip -1; {s.model}",
                mb,
            )
        )
    return rows


# -- the table ---------------------------------------------------------------------------------


def device_line(s: Settings) -> str:
    if s.device != "cuda":
        host = socket.gethostname()
        return f"CPU smoke run on {host} (torch {torch.__version__}); figures are not GPU figures"
    props = torch.cuda.get_device_properties(0)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else "n/a"
    return (
        f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB), torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}, {os.cpu_count()} CPUs, "
        f"host {socket.gethostname()}"
    )


def markdown(rows: list[Row]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| section | check | setting | result | notes |", "|---|---|---|---|---|"]
    lines += [
        f"| {r.section} | {cell(r.check)} | {cell(r.setting)} | {cell(r.result)} | {cell(r.notes)} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def write_results(out: Path, header: str, rows: list[Row], meta: dict[str, Any]) -> None:
    """results.md and results.json, rewritten after every section: a run cut short keeps its figures."""
    (out / "results.md").write_text(f"{header}\n\n{markdown(rows)}")
    meta = {
        "device": header.split(": ", 1)[1],
        **meta,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "argv": sys.argv[1:],
    }
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]}, indent=1)
    )


def model_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--hidden",
        str(args.hidden),
        "--layers",
        str(args.layers),
        "--heads",
        str(args.heads),
        "--seq-len",
        str(args.seq_len),
        "--batch",
        str(args.batch),
        "--vocab",
        str(args.vocab),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, toy sizes: checks the script, not a GPU")
    parser.add_argument("--out", type=Path, help="results folder (default benchmarks/out/gpu-check-<time>)")
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        metavar="S",
        help=f"what to run: {', '.join(SECTIONS)} (default: all)",
    )
    model = parser.add_argument_group("model (default ~1.08B parameters)")
    model.add_argument("--hidden", type=int, default=2048)
    model.add_argument("--layers", type=int, default=20)
    model.add_argument("--heads", type=int, default=16)
    model.add_argument("--seq-len", type=int, default=2048)
    model.add_argument("--batch", type=int, default=4)
    model.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=2, help="flush-stall windows per mode (median)")
    parser.add_argument(
        "--fork-gb",
        type=float,
        nargs="+",
        default=[20.0, 60.0],
        help="host tensor sizes for the fork rows (clamped to 70%% of free memory)",
    )
    parser.add_argument("--timer-pairs", type=int, default=20000)
    parser.add_argument("--snapshot-timeout", type=float, default=180.0, help="seconds per snapshot worker")
    parser.add_argument("--tests-timeout", type=float, default=480.0, help="seconds for the pytest run")
    parser.add_argument("--worker", choices=("snapshot",), help=argparse.SUPPRESS)
    parser.add_argument("--stacks", choices=("python", "all"), default="python", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "snapshot":
        return snapshot_worker(args)
    if not torch.cuda.is_available() and not args.smoke:
        print(
            f"gpu-check: CUDA is not available here (torch {torch.__version__}); nothing to check "
            "(`--smoke` runs the script's plumbing on CPU)"
        )
        return 0
    s = settings(args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = (args.out or REPO / "benchmarks" / "out" / f"gpu-check-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    sections: dict[str, Callable[[], list[Row]]] = {
        "tests": lambda: section_tests(s, out, args.smoke),
        "analysis": lambda: section_analysis(demo_model_module(), s.device, s.dtype, out),
        "stall": lambda: section_stall(s, out),
        "fork": lambda: section_fork(s, out),
        "timers": lambda: section_timers(s, out),
        "snapshot": lambda: section_snapshot(s, out, args),
        "memory": lambda: section_memory(s.device, out, model_flags(args)),
        "trace-size": lambda: section_trace_size(s, out),
    }
    rows: list[Row] = []
    durations: dict[str, float] = {}
    header = f"gpu-check {stamp}: {device_line(s)}"
    for name in args.sections:
        started = time.monotonic()
        print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
        try:
            rows += sections[name]()
        except Exception as err:  # noqa: BLE001 - one broken section must not hide the others' figures
            rows.append(Row(name, "section failed", "", f"{type(err).__name__}", str(err)[:300], ok=False))
        durations[name] = time.monotonic() - started
        gc.collect()
        if torch.cuda.is_available():  # the next section (or its worker process) gets the memory back
            torch.cuda.empty_cache()
        write_results(out, header, rows, {"smoke": args.smoke, "time": stamp, "section_seconds": durations})
        print(markdown([r for r in rows if r.section == name]), file=sys.stderr, flush=True)
    table = markdown(rows)
    print(f"{header}\n\n{table}\nresults: {out}/results.md, results.json")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
