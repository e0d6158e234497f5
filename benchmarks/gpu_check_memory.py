"""``gpu_check.py --sections memory``: `torchprof mem` on snapshots this GPU wrote (issue 28).

Each experiment runs in a fresh process (a clean allocator, and ``PYTORCH_CUDA_ALLOC_CONF`` set
before CUDA starts), records the allocator's history with ``MemorySnapshotter`` and reads the
snapshot back with ``torchprof mem --json``:

* ``oom``: the demo GPT at gpu_check's size (~1.08B parameters, bf16, AdamW), its micro-batch
  doubled every step until a real ``torch.OutOfMemoryError`` in a training step; the guard's
  ``_oom.pickle`` explained (the failed request, the free memory, the cause, the remedy);
* ``fragmentation``: the same allocation pattern (interleaved 3 and 5 MiB tensors, every other one
  freed, then 7 MiB requests) with and without ``expandable_segments:True``: reserved, allocated,
  cached free and its largest block;
* ``long``: a history of ``--long-events`` (1M) entries from a small model's steps, dumped and read
  by ``torchprof mem`` in a subprocess: wall seconds and peak RSS (target: under 10 s and 2 GB);
* ``keep``: a small model's snapshot and a real OOM snapshot (ballast leaves too little for a step),
  gzip-compressed into ``<out>/tests_data/`` to be committed to tests/data (with how they were made).

    python benchmarks/gpu_check_memory.py --worker oom|fragmentation|long|keep --out DIR [--expandable]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from gpu_workload import Row  # noqa: E402

#: the small model of the ``long`` and ``keep`` experiments (tests/helpers/gpu_train.py's Trainer).
SMALL = {"hidden": 256, "layers": 4, "seq_len": 128, "batch": 8}
LONG_EVENTS = 1_000_000


def _mem_json(path: Path) -> dict[str, Any]:
    """``torchprof mem --json PATH`` in a subprocess, with its wall time and peak RSS."""
    started = time.perf_counter()
    code = (
        "import resource, runpy, sys; sys.argv = ['torchprof'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('torchprof_args', run_name='__main__')\nfinally:\n"
        "    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, "mem", "--json", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if run.returncode != 0:
        raise RuntimeError(f"torchprof mem failed on {path}: {run.stderr[-500:]}")
    doc = json.loads(run.stdout)
    doc["_seconds"] = time.perf_counter() - started
    doc["_rss_mb"] = int(run.stderr.strip().splitlines()[-1]) / 1024
    return doc


def _snapshotter(directory: str, max_entries: int = 200_000) -> Any:
    from torchprof_args.capture.runtime.config import MemorySnapshotConfig
    from torchprof_args.capture.runtime.memory_snapshots import MemorySnapshotter

    return MemorySnapshotter(
        MemorySnapshotConfig(enabled=True, output_dir=directory, max_entries=max_entries),
        rank=0,
        host="gpucheck",
    )


def worker_oom(args: argparse.Namespace) -> dict[str, Any]:
    """Double the micro-batch of the ~1B GPT until a training step runs out of memory."""
    import torch
    from gpu_workload import Workload, settings

    s = settings(argparse.Namespace(**{**vars(args), "smoke": False}))
    with tempfile.TemporaryDirectory(dir=args.out) as scratch:
        snap = _snapshotter(scratch)
        batch = s.batch
        with snap.session():
            work = Workload(s)
            for iteration in range(1, 12):
                work.tokens = torch.randint(0, s.vocab, (batch, s.seq_len + 1), device="cuda")
                try:
                    with snap.guard(iteration):
                        work.step()
                except torch.OutOfMemoryError:
                    break
                batch *= 2
            else:
                raise RuntimeError(f"no OOM up to micro-batch {batch}")
        (path,) = Path(scratch).glob("*_oom.pickle")
        doc = _mem_json(path)
    oom = doc["oom"]
    return {
        "batch": batch,
        "params": sum(p.numel() for p in work.model.parameters()),
        "oom": oom,
        "seconds": doc["_seconds"],
    }


def worker_fragmentation(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved blocks, every other one freed, then larger requests; the snapshot's allocator state."""
    import torch

    mib = 1 << 20
    with tempfile.TemporaryDirectory(dir=args.out) as scratch:
        snap = _snapshotter(scratch)
        with snap.session():
            blocks = [
                torch.empty((3 if i % 2 else 5) * mib, dtype=torch.uint8, device="cuda") for i in range(2000)
            ]
            del blocks[::2]
            more = [torch.empty(7 * mib, dtype=torch.uint8, device="cuda") for _ in range(200)]
            torch.cuda.synchronize()
            path = snap.dump(1)
            del more, blocks
        doc = _mem_json(Path(path))
    return {"expandable": args.expandable, "device": doc["snapshots"][0]["devices"][0]}


def worker_long(args: argparse.Namespace) -> dict[str, Any]:
    """Steps of a small model until the history holds ``LONG_EVENTS`` entries; read it back."""
    import torch
    from helpers.gpu_train import Trainer

    with tempfile.TemporaryDirectory(dir=args.out) as scratch:
        snap = _snapshotter(scratch, max_entries=args.long_events)
        with snap.session():
            trainer = Trainer(**SMALL)
            for _ in range(100_000):
                trainer.step()
                if len(torch.cuda.memory._snapshot()["device_traces"][0]) >= args.long_events:
                    break
            path = snap.dump(1)
        doc = _mem_json(Path(path))
        size = os.path.getsize(path)
    device = doc["snapshots"][0]["devices"][0]
    return {
        "events": device["history_events"],
        "mb": size / 1e6,
        "seconds": doc["_seconds"],
        "rss_mb": doc["_rss_mb"],
    }


def worker_keep(args: argparse.Namespace) -> dict[str, Any]:
    """A small model's snapshot and a real OOM snapshot, gzip-compressed into <out>/tests_data/."""
    import torch
    from helpers.gpu_train import Trainer

    keep = Path(args.out) / "tests_data"
    keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out) as scratch:
        snap = _snapshotter(scratch, max_entries=20_000)
        with snap.session():
            trainer = Trainer(**SMALL)
            for _ in range(3):
                trainer.step()
            steady = snap.dump(3)
            free, _ = torch.cuda.mem_get_info()
            ballast = torch.empty(free - (32 << 20), dtype=torch.uint8, device="cuda")  # leave 32 MiB
            for batch in (64, 256, 1024, 4096):
                try:
                    with snap.guard(4):
                        Trainer(**{**SMALL, "batch": batch}).step()
                except torch.OutOfMemoryError:
                    break
            del ballast
        (oom,) = Path(scratch).glob("*_oom.pickle")
        kept = {}
        for source, name in (
            (Path(steady), "cuda_snapshot_small.pickle.gz"),
            (oom, "cuda_oom_snapshot_small.pickle.gz"),
        ):
            with open(source, "rb") as src, gzip.open(keep / name, "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            kept[name] = (keep / name).stat().st_size
    return {"files": kept, "device": torch.cuda.get_device_name(), "torch": torch.__version__}


WORKERS = {"oom": worker_oom, "fragmentation": worker_fragmentation, "long": worker_long, "keep": worker_keep}


def _worker(
    kind: str,
    out: Path,
    model_flags: list[str],
    timeout: float,
    expandable: bool = False,
    long_events: int = LONG_EVENTS,
) -> dict[str, Any]:
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if expandable else ""}
    command = [
        sys.executable,
        __file__,
        "--worker",
        kind,
        "--out",
        str(out),
        "--long-events",
        str(long_events),
        *model_flags,
        *(["--expandable"] if expandable else []),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"memory worker {kind} failed: {run.stderr[-800:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def section_memory(device: str, out: Path, model_flags: list[str], timeout: float = 600) -> list[Row]:
    """The memory section's rows."""
    if device != "cuda":
        return [
            Row(
                "memory",
                "torchprof mem on real snapshots",
                "oom / fragmentation / 1M events",
                "n/a",
                "needs CUDA",
            )
        ]
    rows = []
    found = _worker("oom", out, model_flags, timeout)
    oom = found["oom"]
    remedy = oom["remedy"]["kind"] if oom["remedy"] else "none alone"
    rows.append(
        Row(
            "memory",
            "real OOM explained",
            f"{found['params'] / 1e9:.2f}B GPT, micro-batch {found['batch']}",
            f"{oom['cause']}, missing {_gib(oom['missing_bytes'])}",
            f"asked {_gib(oom['requested_bytes'])}, CUDA free {_gib(oom['device_free_bytes'])}, cached "
            f"free {_gib(oom['cached_free_bytes'])} (largest {_gib(oom['largest_free_block_bytes'])}); "
            f"remedy {remedy}; held {oom['held']}",
            found["seconds"],
            ok=oom["requested_bytes"] > 0 and oom["held"]["parameter"] > 0,
        )
    )
    for expandable in (False, True):
        state = _worker("fragmentation", out, model_flags, timeout, expandable)["device"]
        rows.append(
            Row(
                "memory",
                "fragmentation",
                f"expandable_segments {expandable}",
                f"{state['fragmentation_pct']:.0f} % of {_gib(state['cached_free_bytes'])} cached free",
                f"reserved {_gib(state['reserved_bytes'])}, allocated {_gib(state['allocated_bytes'])}, "
                f"largest free block {_gib(state['largest_free_block_bytes'])}",
                state["fragmentation_pct"],
            )
        )
    long = _worker("long", out, model_flags, timeout)
    rows.append(
        Row(
            "memory",
            "torchprof mem, long history",
            f"{long['events']:,} events ({long['mb']:.0f} MB)",
            f"{long['seconds']:.1f} s, {long['rss_mb']:.0f} MB RSS",
            "target: < 10 s and 2 GB",
            long["seconds"],
            ok=long["seconds"] < 10 and long["rss_mb"] < 2048,
        )
    )
    keep = _worker("keep", out, model_flags, timeout)
    sizes = ", ".join(f"{name} {size / 1e3:.0f} KB" for name, size in keep["files"].items())
    rows.append(
        Row(
            "memory",
            "snapshots for tests/data",
            f"{keep['device']}, torch {keep['torch']}",
            "written",
            f"{sizes} in {out / 'tests_data'}",
        )
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=sorted(WORKERS), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--expandable", action="store_true")
    parser.add_argument("--long-events", type=int, default=LONG_EVENTS)
    for flag, default in (
        ("--hidden", 2048),
        ("--layers", 20),
        ("--heads", 16),
        ("--seq-len", 2048),
        ("--batch", 4),
        ("--vocab", 32000),
    ):
        parser.add_argument(flag, type=int, default=default)
    for flag, default in (
        ("--repeats", 1),
        ("--timer-pairs", 1),
        ("--snapshot-timeout", 60.0),
        ("--tests-timeout", 60.0),
    ):
        parser.add_argument(flag, type=type(default), default=default)
    parser.add_argument("--fork-gb", type=float, nargs="+", default=[1.0])
    args = parser.parse_args()
    print(json.dumps(WORKERS[args.worker](args)))
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
