"""A cycle's traces rewritten as if some ranks ran on other hosts (issue 36's proof by simulation).

These machines are one host, so every real multi-rank job's traces share a clock.  A trace written
on another host differs in two ways, both reproduced here:

* its host booted at another time: Kineto's ``ts`` (a monotonic clock since boot) are smaller or
  larger by the difference, and ``baseTimeNanoseconds`` (wall clock minus that clock) larger or
  smaller by as much, so ``baseTimeNanoseconds + ts`` is unchanged by the boot time alone;
* its wall clock is off by X (NTP's error): ``baseTimeNanoseconds + ts`` moves by X.

The host's name moves too: the trace's ``host_name``, this package's ``torchprof_args.host`` and the
file name (``rank00001_<host>_pid...``).  Sidecars are not copied: the rewritten traces are parsed
(or given new sidecars by ``torchprof summary --write-sidecars``).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Mapping
from pathlib import Path

from torchprof_args.naming import host_from_file_name, rank_from_file_name

__all__ = ["move_to_host", "simulate_hosts"]

_STEM = re.compile(r"^(rank\d+)_(.+)_(pid\d+)")


def _open(path: Path, mode: str):  # noqa: ANN202 - text file object
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def _renamed(name: str, host: str, rank: int) -> str:
    """``name`` with ``host`` in it (``rank00001_<host>_pid7.pt.trace.json.gz``), also for a file not
    named by this package."""
    if _STEM.match(name):
        return _STEM.sub(lambda m: f"{m.group(1)}_{host}_{m.group(3)}", name, count=1)
    suffix = ".json.gz" if name.endswith(".json.gz") else ".json"
    return f"rank{rank:05d}_{host}_pid{rank}.pt.trace{suffix}"


def move_to_host(trace: Path, out_dir: Path, host: str, clock_offset_us: float, boot_us: float = 0.0,
                 rank: int | None = None, drift_us_per_s: float = 0.0) -> Path:
    """``trace`` as host ``host`` would have written it, in ``out_dir``.

    Args:
        trace: a Kineto trace (``.json`` or ``.json.gz``).
        out_dir: where the rewritten trace goes (created).
        host: the other host's name.
        clock_offset_us: how far that host's wall clock is ahead (``baseTimeNanoseconds + ts`` moves by it).
        boot_us: how much later that host booted (every ``ts`` smaller by it).
        rank: the trace's rank, for a file name that does not say it.
        drift_us_per_s: how fast that host's clock runs ahead (its offset is ``clock_offset_us`` at the
            trace's first event and grows by this much per second after it).

    Returns:
        The rewritten trace's path.
    """
    with _open(trace, "rt") as fh:
        doc = json.load(fh)
    first = min((e["ts"] for e in doc["traceEvents"] if "ts" in e), default=0.0)
    for event in doc["traceEvents"]:
        if "ts" in event:
            event["ts"] = event["ts"] - boot_us + drift_us_per_s * (event["ts"] - first) / 1e6
    base = int(doc.get("baseTimeNanoseconds") or 0)
    doc["baseTimeNanoseconds"] = base + round((boot_us + clock_offset_us) * 1000)
    doc["host_name"] = host
    if isinstance(doc.get("torchprof_args"), dict):
        doc["torchprof_args"]["host"] = host
    rank = rank if rank is not None else rank_from_file_name(trace.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / _renamed(trace.name, host, rank if rank is not None else 0)
    with _open(out, "wt") as fh:
        json.dump(doc, fh)
    return out


def simulate_hosts(traces: list[Path], out_dir: Path, clocks: Mapping[int, tuple[str, float]],
                   boot_us: float = 7.2e9, drift_us_per_s: Mapping[str, float] | None = None) -> list[Path]:
    """One cycle's traces with the ranks in ``clocks`` moved to other hosts.

    Args:
        traces: the cycle's traces, one per rank (their file names say the rank).
        out_dir: where the cycle goes (its folder name kept: ``out_dir / traces[0].parent.name``).
        clocks: rank -> (its host, that host's clock offset in us); the other ranks keep their host
            (or ``host0`` where their trace says none) and clock.
        boot_us: how much later each other host booted, times its position in ``clocks``' hosts
            (so that no two hosts share a boot time).
        drift_us_per_s: per other host, how fast its clock runs ahead (:func:`move_to_host`).

    Returns:
        The rewritten traces.
    """
    cycle = out_dir / traces[0].parent.name
    hosts = list(dict.fromkeys(host for host, _ in clocks.values()))
    out = []
    for trace in traces:
        rank = rank_from_file_name(trace.name)
        if rank in clocks:
            host, offset = clocks[rank]
            out.append(move_to_host(trace, cycle, host, offset, boot_us * (1 + hosts.index(host)), rank,
                                    (drift_us_per_s or {}).get(host, 0.0)))
        else:
            out.append(move_to_host(trace, cycle, host_from_file_name(trace.name) or "host0", 0.0, 0.0, rank))
    return out


#: the clock tests' profile: every rank traced after a skipped and a warm-up step.
PROFILE = ("--torch-profile", "--torch-profile-dir", "prof", "--torch-profile-ranks", "all",
           "--torch-profile-skip-first", "1", "--torch-profile-warmup", "1")


def straggler_job(folder: Path, iters: int, active: int) -> list[Path]:
    """The traces of a real 2-rank gloo DDP job (tests/jobs/diagnose_job.py) whose rank 1 works 30 ms
    more before each gradient all-reduce, ``active`` steps of ``iters`` traced."""
    from helpers.paths import JOBS
    from helpers.processes import rank_results, run_torchrun

    proc = run_torchrun(JOBS / "diagnose_job.py", "--result-dir", str(folder), "--iters", str(iters),
                        "--slow-rank", "1", "--slow-ms", "30", *PROFILE,
                        "--torch-profile-active", str(active), cwd=folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["ended"] for r in rank_results(folder).values()} == {"done"}
    return sorted((folder / "prof").glob("iter*/*.pt.trace.json.gz"))

