"""Fault scenarios on real 2-rank torchrun/gloo jobs (``fault_job.py``), and what each left behind.

:func:`run` mounts what a scenario needs (small tmpfs filesystems), runs the job with its own
``TMPDIR``, unmounts, and returns an :class:`Outcome`: every rank's result and log lines,
partial files under the output directory, leftovers in every staging directory the ranks used
(``/dev/shm``, the temp directory, explicit ones), publisher processes still alive, seconds.
``FAULTS`` lists one scenario per fault (``benchmarks/bench_faults.py`` prints a row for each);
``tests/test_faults.py`` combines several faults per job to stay lean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from helpers import faults
from helpers.paths import JOBS
from helpers.processes import free_port, subprocess_env

JOB = JOBS / "fault_job.py"
BASE = ["--torch-profile", "--torch-profile-dir", "{out}", "--no-torch-profile-operator-table",
        "--result-dir", "{res}"]
HEAVY = ["--layers", "24", "--torch-profile-record-shapes", "--torch-profile-with-stack",
         "--torch-profile-active", "2", "--torch-profile-gzip-level", "9"]


@dataclasses.dataclass
class Scenario:
    """One job: fault_job.py arguments (``{out}``, ``{stage}``, ``{stage1}``, ``{res}``, ``{root}``
    filled in), the tmpfs mounts it needs as ``(name, size, read_only)``, and how it should end:
    ``finish`` (every rank trains to the end), ``refuse`` (a one-line error before training) or
    ``sigterm``."""

    name: str
    args: list[str]
    mounts: tuple[tuple[str, str, bool], ...] = ()
    expect: str = "finish"
    needs_fork_limit: bool = False
    iters: int = 6
    timeout: float = 240.0
    #: Called with the paths (``out``, ``stage``, ``res``, ``root``) before the job starts.
    prepare: Callable[[dict[str, Path]], None] | None = None

    def needs_mount(self) -> bool:
        return bool(self.mounts) or any("remount" in a for a in self.args)


@dataclasses.dataclass
class Outcome:
    scenario: Scenario
    returncode: int
    output: str
    seconds: float
    results: dict[int, dict]
    logs: dict[int, list[str]]
    pids: dict[int, int]
    partials: list[str]
    leftovers: list[str]
    orphans: list[int]
    traces: list[Path]
    bad_traces: list[str]

    @property
    def crashed(self) -> bool:
        """A rank died of a signal other than SIGTERM (a segfault...)."""
        return any(f"exitcode  : -{sig}" in self.output for sig in (4, 6, 7, 9, 11))

    @property
    def survived(self) -> bool:
        expect, finished = self.scenario.expect, sorted(self.results)
        if self.crashed or self.bad_traces:
            return False
        if expect == "finish":
            return self.returncode == 0 and finished == [0, 1] and all(
                r["iterations"] == self.scenario.iters for r in self.results.values())
        if expect == "refuse":
            return self.returncode != 0 and not finished and "error: " in self.output
        return self.returncode != 0 and "exitcode  : -15" in self.output

    def errors(self, rank: int) -> list[str]:
        return [line for line in self.logs.get(rank, []) if line.startswith("ERROR")]



def run(scenario: Scenario, root: str | os.PathLike[str]) -> Outcome:
    """Run ``scenario`` under ``root`` (a fresh directory) and collect what it left behind."""
    root = Path(root)
    paths = {"out": root / "out", "stage": root / "stage", "stage1": root / "stage1", "res": root / "res",
             "root": root}
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    args = [a.format(**{k: str(v) for k, v in paths.items()}) for a in [*BASE, *scenario.args]]
    args += ["--iters", str(scenario.iters)]
    env = subprocess_env(TMPDIR=str(root / "tmp"), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", str(JOB), *args]
    with contextlib.ExitStack() as stack:
        for name, size, read_only in scenario.mounts:
            stack.enter_context(faults.tmpfs(paths[name], size, read_only=read_only))
        if scenario.prepare is not None:
            scenario.prepare(paths)
        started = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=scenario.timeout,
                              cwd=root)
        seconds = time.monotonic() - started
        time.sleep(0.2)  # let killed processes go
        outcome = _collect(scenario, proc, seconds, paths)
    return outcome


def _collect(scenario: Scenario, proc: subprocess.CompletedProcess[str], seconds: float,
             paths: dict[str, Path]) -> Outcome:
    res = paths["res"]
    results = {r["rank"]: r for r in (json.loads(p.read_text()) for p in sorted(res.glob("rank*.json")))}
    pids = {r["rank"]: r["pid"]
            for r in (json.loads(p.read_text()) for p in sorted(res.glob("started*.json")))}
    logs = {int(p.stem[3:]): p.read_text().splitlines() for p in sorted(res.glob("log*.txt"))}
    out = paths["out"]
    files = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    partials = [str(p) for p in files if p.name.startswith(".partial") or p.name.endswith((".tmp", ".part"))]
    traces = [p for p in files if p.name.endswith(".pt.trace.json.gz")]
    return Outcome(scenario, proc.returncode, proc.stdout + proc.stderr, seconds, results, logs, pids,
                   partials, _staging_leftovers(paths, pids.values()),
                   faults.processes_mentioning(str(paths["root"])),
                   traces, [str(t) for t in traces if not _valid_trace(t)])


def _staging_leftovers(paths: dict[str, Path], pids) -> list[str]:
    """Anything left in the ranks' staging directories (they should be gone)."""
    user = f"torchprof-{os.getuid()}"
    bases = [Path("/dev/shm"), paths["root"] / "tmp", paths["stage"]]
    found = []
    for base in bases:
        for pid in pids:
            directory = base / user / f"pid{pid}"
            if directory.exists():
                found += [str(p) for p in directory.rglob("*")] or [str(directory)]
    return found


def _valid_trace(path: Path) -> bool:
    try:
        with gzip.open(path, "rt") as handle:
            return "traceEvents" in json.load(handle)
    except (OSError, ValueError):
        return False


def trace_steps(path: Path) -> list[int]:
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return sorted(int(e["name"].split("#")[1]) for e in events
                  if e.get("name", "").startswith("ProfilerStep#"))


def group_writable_staging(paths: dict[str, Path]) -> None:
    """A staging directory someone else could write to: ``<stage>/torchprof-<uid>`` mode 0777."""
    user_dir = paths["stage"] / f"torchprof-{os.getuid()}"
    user_dir.mkdir(parents=True, exist_ok=True)
    user_dir.chmod(0o777)


def read_only_output(paths: dict[str, Path]) -> None:
    """Without root: an output directory without write permission (root ignores it: a read-only tmpfs)."""
    paths["out"].mkdir(parents=True, exist_ok=True)
    paths["out"].chmod(0o555)


def summaries_unwritable(paths: dict[str, Path]) -> None:
    """The cycle's ``summaries`` a file, not a folder: the trace can be published, its summary sidecar
    and operator table cannot (the first cycle of a 4-iteration job: ``iter000003-000003``)."""
    cycle = paths["out"] / "iter000003-000003"
    cycle.mkdir(parents=True, exist_ok=True)
    (cycle / "summaries").write_text("not a folder")


#: One scenario per fault (benchmarks/bench_faults.py prints a row for each).
FAULTS = [
    Scenario("output dir unwritable from the start", [],
             mounts=(("out", "1m", True),) if faults.can_mount() else (),
             expect="refuse", iters=4, prepare=None if faults.can_mount() else read_only_output),
    Scenario("staging dir group-writable on one rank",
             ["--torch-profile-ranks", "all", "--rank-staging", "1={stage}"],
             expect="refuse", iters=4, prepare=group_writable_staging),
    Scenario("output dir unwritable mid-run",
             ["--torch-profile-repeat", "2", "--output-fs", "{out}",
              "--at", "4:drain", "--at", "4:remount-ro"],
             mounts=(("out", "64m", False),)),
    Scenario("output filesystem full during publish", ["--output-fs", "{out}", "--at", "2:fill-output"],
             mounts=(("out", "16m", False),), iters=4),
    Scenario("staging filesystem full during export (fork)",
             ["--torch-profile-staging-dir", "{stage}", "--fill-dir", "{stage}",
              "--inject", "0:1:fill-staging"],
             mounts=(("stage", "256m", False),), iters=4),
    Scenario("staging filesystem full during export (inline)",
             ["--torch-profile-export", "inline", "--torch-profile-staging-dir", "{stage}",
              "--fill-dir", "{stage}", "--inject", "0:1:fill-staging"],
             mounts=(("stage", "256m", False),), iters=4),
    Scenario("publisher SIGKILLed mid-publish", [*HEAVY, "--kill-publisher", "0"], iters=5),
    Scenario("export raises (fork)", ["--inject", "0:1:raise"], iters=4),
    Scenario("export raises (inline)", ["--torch-profile-export", "inline", "--inject", "0:1:raise"],
             iters=4),
    Scenario("fork fails (EAGAIN)", ["--inject", "0:1:fork-limit"], needs_fork_limit=True, iters=4),
    Scenario("SIGTERM to one rank mid-flush (fork)", ["--inject", "0:1:sigterm-in-flush"], expect="sigterm"),
    Scenario("SIGTERM to one rank mid-export (inline)",
             ["--torch-profile-export", "inline", "--inject", "0:1:sigterm-in-export"], expect="sigterm"),
    Scenario("SIGTERM to a rank blocked at the fence",
             ["--torch-profile-memory-snapshot", "--slow-snapshot", "1:30", "--sigterm-in-fence", "0:1",
              "--torch-profile-term-grace", "3"], expect="sigterm"),
    Scenario("slow interval memory snapshot (PG timeout 2 s)",
             ["--pg-timeout", "2", "--torch-profile-memory-snapshot",
              "--torch-profile-memory-snapshot-interval", "4", "--slow-snapshot", "0:4",
              "--torch-profile-skip-first", "10"]),
    Scenario("slow publisher at exit (PG timeout 2 s)",
             ["--pg-timeout", "2", "--stop-publisher", "0:5", "--collective-after-exit"], iters=3),
    Scenario("summary sidecar unwritable", ["--torch-profile-operator-table"], iters=4,
             prepare=summaries_unwritable),
    Scenario("low host memory ends a window early",
             ["--torch-profile-active", "4", "--torch-profile-ranks", "all",
              "--torch-profile-min-free-host-mb", "100000000"]),
]
