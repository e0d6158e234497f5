"""The collectives of profiling at 32 ranks: gloo on CPU, a tiny model, the cores oversubscribed.

    python benchmarks/bench_world.py [--world 32] [--tp 2] [--pp 2] [--hosts 4] [--json FILE]

Job 1 (``--world`` ranks, torchrun): megatron-core's ``parallel_state`` at TP x PP x DP
(``--tp``, ``--pp``, DP the rest: TP 2 x PP 2 x DP 8 at 32 ranks) and ``--torch-profile-parallel-ranks
pp=1 dp=0-1``; two scheduled cycles, an on-demand request of rank 0 for ranks 1 and world-2, the
timers' all-gather with one slow rank.  Checked from every rank's result file: the traced ranks are
exactly those whose parallel coordinates match; every rank met at the fence at every flush and at
exit (the same count everywhere); the on-demand window was adopted by every rank and traced by the
two asked; rank 0's gather holds every rank with its coordinates and names the slow rank; rank 0
alone logs the publishing line.

Job 2 (``--world`` ranks, ``tests/jobs/comm_job.py``): rank ``world // 2 + 1`` skips an all-reduce
(the README's hang example at scale); every rank dumps its flight recorder and ``torchprof hang``
names the skipping rank.

Job 3 (``--hosts H`` > 1; ``--world`` ranks, ``tests/jobs/comm_job.py``, every rank traced, rank
``world - 1`` 40 ms late at one all-reduce): the cycle rewritten as if the ranks ran on H hosts
(contiguous blocks of ranks; ``tests/helpers/hosts.py``: another boot time each, wall clocks set
apart at random by up to +-100 ms, seeded); ``torchprof collectives --json`` of both.  Checked: each
host's estimated offset is the injected one within its stated uncertainty (a row per host:
injected, estimated, uncertainty), and the rank that caused the most waiting and every matched
collective's last rank (where its skew exceeds twice the uncertainty) are the one-host cycle's.

Prints one row per check (seconds, result).  Output under benchmarks/out/world<N>/ (git-ignored).
Needs megatron-core (``pip install megatron-core``); only job 2 runs without it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # helpers.hosts (job 3)
COMM_JOB = REPO / "tests" / "jobs" / "comm_job.py"
SELECTOR = ["pp=1", "dp=0-1"]
ITERS = 12


def worker(args: argparse.Namespace) -> None:
    """Job 1 on one rank; writes ``results/rank<R>.json``."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from torchprof_args import Timers, TorchProfiler, add_torch_profile_args
    from torchprof_args.atomic import write_json_atomically
    from torchprof_args.capture.ondemand.client import submit

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
    coords = {"dp": ps.get_data_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
              "pp": ps.get_pipeline_model_parallel_rank()}
    argv = ["--torch-profile", "--torch-profile-dir", str(out / "prof"), "--torch-profile-parallel-ranks",
            *SELECTOR, "--torch-profile-skip-first", "1", "--torch-profile-wait", "1",
            "--torch-profile-warmup", "1", "--torch-profile-active", "1", "--torch-profile-repeat", "2",
            "--no-torch-profile-operator-table",
            "--torch-profile-on-demand", "--torch-profile-on-demand-interval", "1",
            "--torch-profile-on-demand-check-seconds", "0.001",
            "--torch-profile-max-publishing", "8"]  # every window: the checks count them (bench_soak skips)
    prof = TorchProfiler.from_args(add_torch_profile_args(argparse.ArgumentParser()).parse_args(argv))
    timers = Timers(0, "minmax")
    grad = torch.zeros(64)
    gathered = None
    with prof:
        if rank == 0:
            submit(Path(prof.config.on_demand.control_dir), 1, [1, world - 2])
        for iteration in range(1, ITERS + 1):
            timers("fwd", log_level=0).start()
            time.sleep(0.05 if rank == world - 1 else 0.005)  # the slow rank the gather must name
            timers("fwd").stop()
            dist.all_reduce(grad)
            prof.step(iteration)
            if iteration == ITERS // 2:
                snapshot = timers.gather(["fwd"])
                gathered = {"world": snapshot.world_size, "global_ranks": snapshot.global_ranks,
                            "coordinates": snapshot.coordinates, "fwd": snapshot.rank_times("fwd")}
    write_json_atomically(out / "results" / f"rank{rank}.json", {
        "rank": rank, "coords": coords, "fence_waits": prof.stats["fence_waits"],
        "traces": prof.published_traces, "record": prof.record, "gathered": gathered if rank == 0 else None})
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _torchrun(world: int, script: Path, *args: str, env: dict[str, str],
              timeout: float) -> tuple[int, str, float]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
                           "--master_addr=127.0.0.1", f"--master_port={port}", str(script), *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=env["BENCH_CWD"])
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def _matches(coords: dict[str, int]) -> bool:
    for token in SELECTOR:
        axis, values = token.split("=")
        low, _, high = values.partition("-")
        if not int(low) <= coords[axis] <= int(high or low):
            return False
    return True


def check_job1(out: Path, world: int, output: str) -> dict[str, object]:
    """The checks of job 1 from the ranks' result files: name -> (ok, detail)."""
    files = (out / "results").glob("rank*.json")
    results = {r["rank"]: r for r in (json.loads(p.read_text()) for p in files)}
    if sorted(results) != list(range(world)):
        return {"every rank finished": (False, f"{len(results)} of {world}: {output[-3000:]}")}
    expected = sorted(r for r, res in results.items() if _matches(res["coords"]))
    scheduled = {r for r, res in results.items() for t in res["traces"]
                 if Path(t).parent.name in ("iter000004-000004", "iter000007-000007")}
    on_demand = {r: sorted(Path(t).parent.name for t in res["traces"]
                           if Path(t).parent.name not in ("iter000004-000004", "iter000007-000007"))
                 for r, res in results.items()}
    asked = {1, world - 2}
    waits = {res["fence_waits"] for res in results.values()}
    gathered = results[0]["gathered"]
    coords = [results[r]["coords"] for r in range(world)]
    slowest = max(range(world), key=lambda r: gathered["fwd"][r])
    lines = [line for line in output.splitlines() if "trace(s) published up to" in line]
    return {
        f"parallel ranks {' '.join(SELECTOR)} traced exactly": (
            sorted(scheduled) == expected
            and sorted(r for r, res in results.items() if res["record"]) == expected,
            f"expected {expected}, traced {sorted(scheduled)}"),
        "fence at every flush and at exit, same count on every rank": (
            waits == {4}, f"fence waits per rank {sorted(waits)} (2 scheduled + 1 on-demand flush + exit)"),
        "on-demand window adopted everywhere, traced by the asked ranks": (
            {r for r, cycles in on_demand.items() if cycles} == asked
            and len({c for cycles in on_demand.values() for c in cycles}) == 1,
            f"asked {sorted(asked)}, traced {sorted(r for r, c in on_demand.items() if c)} in "
            f"{sorted({c for cycles in on_demand.values() for c in cycles})}"),
        "timers' gather: every rank, its coordinates, the slow rank": (
            gathered["world"] == world and gathered["global_ranks"] == list(range(world))
            and [{k: c[k] for k in ("dp", "tp", "pp")} for c in gathered["coordinates"]] == coords
            and slowest == world - 1, f"{gathered['world']} ranks, slowest rank {slowest}"),
        "quiet: only rank 0 logs the publishing lines": (
            bool(lines) and all("[torchprof rank 0]" in line for line in lines),
            f"{len(lines)} line(s), {output.count('trace written')} per-trace"),
    }


def check_job2(out: Path, world: int, env: dict[str, str], timeout: float,
               pg_timeout: float) -> tuple[dict, float]:
    skipper = world // 2 + 1
    run_dir = out / "hang"
    run_dir.mkdir(parents=True)
    job = ["--result-dir", str(run_dir), "--iters", "5", "--skip-rank", str(skipper), "--skip-iteration", "3",
           "--pg-timeout", str(pg_timeout), "--torch-profile", "--torch-profile-ranks", "0",
           "--torch-profile-skip-first", "0", "--torch-profile-active", "2",
           "--torch-profile-dir", str(run_dir / "prof"), "--torch-profile-flight-recorder", "64"]
    _, _, seconds = _torchrun(world, COMM_JOB, *job, env=env, timeout=timeout)
    dumps = sorted(p.name for p in (run_dir / "prof" / "flight_recorder").glob("dump_info_rank*.json"))
    hang = subprocess.run([sys.executable, "-m", "torchprof_args", "hang", str(run_dir / "prof")],
                          capture_output=True, text=True, env=env, timeout=timeout)
    named = f"rank {skipper} did not join"
    return {
        "flight recorder: every rank dumped": (len(dumps) == world, f"{len(dumps)} of {world} dumps"),
        f"torchprof hang names the skipping rank ({skipper})": (
            hang.returncode == 0 and named in hang.stdout,
            next((line for line in hang.stdout.splitlines() if "did not join" in line),
                 hang.stdout[-500:] + hang.stderr[-1500:])),
    }, seconds


def check_job3(out: Path, world: int, hosts: int, env: dict[str, str], timeout: float
               ) -> tuple[dict, float, list[str]]:
    """Job 3: the hosts' clocks estimated against the injected offsets (the module's docstring)."""
    import random

    from helpers.hosts import simulate_hosts

    run_dir = out / "hosts"
    run_dir.mkdir(parents=True)
    job = ["--result-dir", str(run_dir), "--iters", "8", "--slow-rank", str(world - 1),
           "--slow-iteration", "4", "--slow-seconds", "0.04",
           "--torch-profile", "--torch-profile-ranks", "all",
           "--torch-profile-skip-first", "1", "--torch-profile-warmup", "1", "--torch-profile-active", "5",
           "--torch-profile-dir", str(run_dir / "prof")]
    code, output, seconds = _torchrun(world, COMM_JOB, *job, env=env, timeout=timeout)
    traces = sorted((run_dir / "prof").glob("iter*/*.pt.trace.json.gz"))
    if code != 0 or len(traces) != world:
        return {"job 3 traced every rank": (False, f"exit {code}, {len(traces)} traces: {output[-800:]}")}, \
            seconds, []
    rng = random.Random(36)
    per_host = -(-world // hosts)
    injected = {f"h{k}": rng.uniform(-100_000.0, 100_000.0) for k in range(1, hosts)}
    clocks = {rank: (f"h{rank // per_host}", injected[f"h{rank // per_host}"])
              for rank in range(per_host, world)}
    moved = simulate_hosts(traces, run_dir / "moved", clocks)

    def report(cycle: Path) -> dict:
        proc = subprocess.run([sys.executable, "-m", "torchprof_args", "collectives", str(cycle), "--json",
                               "--no-progress"], capture_output=True, text=True, env=env, timeout=timeout)
        return json.loads(proc.stdout)

    one, many = report(traces[0].parent), report(moved[0].parent)
    rows, within = [], []
    for clock in many["clock"]["hosts"][1:]:
        truth = -injected[clock["host"]]
        ok = abs(clock["offset_us"] - truth) <= clock["uncertainty_us"]
        within.append(ok)
        rows.append(f"    host {clock['host']} (ranks {clock['ranks'][0]}-{clock['ranks'][-1]}): injected "
                    f"{truth / 1e3:+9.3f} ms, estimated {clock['offset_us'] / 1e3:+9.3f} ms "
                    f"(+-{clock['uncertainty_us'] / 1e3:.3f}) on {clock['collectives']} collectives")
    worst = max(h["uncertainty_us"] for h in many["clock"]["hosts"])
    before = {i["id"]: i for i in one["instances"] if i["ranks"] > 1}
    after = {i["id"]: i for i in many["instances"] if i["ranks"] > 1}
    same_last = [i for i in before if i in after and before[i]["skew_us"] > 2 * worst
                 and before[i]["last_rank"] == after[i]["last_rank"]]
    judged = [i for i in before if before[i]["skew_us"] > 2 * worst]
    top = one["ranks_by_wait_caused"][0]["rank"], many["ranks_by_wait_caused"][0]["rank"]
    return {
        f"clock: {hosts - 1} hosts' offsets within their uncertainty": (
            bool(within) and all(within), f"{sum(within)} of {len(within)}; {many['clock']['collectives']} "
                                          "shared collectives"),
        "clock: the same rank caused the most waiting": (top[0] == top[1], f"rank {top[0]} / rank {top[1]}"),
        "clock: every clear skew keeps its last rank": (len(same_last) == len(judged),
                                                        f"{len(same_last)} of {len(judged)}"),
    }, seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=32)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--out", help="output directory (default benchmarks/out/world<N>)")
    parser.add_argument("--json", help="also write the checks to this file")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    parser.add_argument("--pg-timeout", type=float, default=60.0,
                        help="job 2's gloo timeout: how long the other ranks wait for the skipping one")
    parser.add_argument("--hosts", type=int, default=1,
                        help="job 3: the cycle rewritten as if on this many hosts (clocks apart at random)")
    parser.add_argument("--skip-jobs", default="", help="comma-separated jobs not to run (1, 2)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out or REPO / "benchmarks" / "out" / f"world{args.world}")
    if args.worker:
        worker(args)
        return
    shutil.rmtree(out, ignore_errors=True)
    (out / "tmp").mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out / "tmp"), "BENCH_CWD": str(out),
           "TORCHPROF_RUNTIME_DIR": str(out / "runtime"), "TORCHPROF_LOG_LEVEL": "INFO",
           "PYTHONPATH": os.pathsep.join(
               p for p in (str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)}
    checks: dict[str, tuple[bool, str]] = {}
    seconds: dict[str, float] = {}
    skip = set(args.skip_jobs.split(",")) - {""}
    if "1" not in skip:
        if importlib.util.find_spec("megatron") and importlib.util.find_spec("megatron.core"):
            job = ["--worker", "--out", str(out), "--tp", str(args.tp), "--pp", str(args.pp)]
            _, output, seconds["job 1"] = _torchrun(args.world, Path(__file__), *job, env=env,
                                                    timeout=args.timeout)
            checks.update(check_job1(out, args.world, output))
        else:
            checks["megatron-core installed"] = (False, "pip install megatron-core for job 1")
    if "2" not in skip:
        job2, seconds["job 2"] = check_job2(out, args.world, env, args.timeout, args.pg_timeout)
        checks.update(job2)
    rows: list[str] = []
    if args.hosts > 1:
        job3, seconds["job 3"], rows = check_job3(out, args.world, args.hosts, env, args.timeout)
        checks.update(job3)
    print(f"bench_world: {args.world} gloo ranks on {os.cpu_count()} CPU cores (TP {args.tp} x PP {args.pp} "
          f"x DP {args.world // (args.tp * args.pp)}); job 1 {seconds.get('job 1', 0):.0f} s, "
          f"job 2 (hang) {seconds.get('job 2', 0):.0f} s, job 3 (hosts) {seconds.get('job 3', 0):.0f} s")
    for name, (ok, detail) in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print("\n".join(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"world": args.world, "seconds": seconds,
                                               "checks": {k: list(v) for k, v in checks.items()}}, indent=1))
    if not all(ok for ok, _ in checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
