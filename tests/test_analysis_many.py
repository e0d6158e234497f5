"""Many ranks: sidecars, run/cycle folders, sharding, the cross-rank view, the report, and diff vs HTA."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import DATA, REPO
from msgspec.structs import replace

from torchprof_args.analysis import Summary, cross_rank, load_trace, summarize
from torchprof_args.analysis.analyzers.origin import parallel_from_pg_config
from torchprof_args.analysis.collect.discover import expand, group_by_cycle
from torchprof_args.analysis.collect.shard import parse_shard, shard_files
from torchprof_args.analysis.collect.sidecar import write_sidecar
from torchprof_args.analysis.collect.trace_results import SUMMARY, read_results
from torchprof_args.analysis.render.report import render_report
from torchprof_args.analysis.render.text import format_cross_rank
from torchprof_args.errors import TraceError
from torchprof_args.naming import sidecar_path
from torchprof_args.shared import formats

GPU_2RANK = DATA / "gpu_2rank_nccl_rank0.json.gz"
RANKS_128 = sorted(DATA.glob("gpu_128rank_sampled_rank*.json.gz"))
CPU_CYCLES = [DATA / "cpu_2rank_gloo_rank0_iter3.json.gz", DATA / "cpu_2rank_gloo_rank0_iter5.json.gz"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "torchprof_args", *args, "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)


def _run_folder(root: Path) -> Path:
    """A run folder in the profiler's layout: two cycles of the 128-rank job's two real ranks, plus
    what else a run folder holds (wandb JSON, a trace being published, a metrics file)."""
    for cycle in ("iter000010-000011", "iter000020-000021"):
        for src in RANKS_128:
            target = root / cycle / f"rank{int(src.name[-9]):05d}_node0_pid4{src.name[-9]}.pt.trace.json.gz"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, target)
        (root / cycle / ".partial-rank00002_node0_pid43.pt.trace.json.gz").write_bytes(b"half")
    (root / "wandb_run.json").write_text("{}")
    (root / "metrics.jsonl").write_text("{}\n")
    return root


def test_discovery_of_run_cycle_and_flat_folders(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    files = expand([run])
    assert [f.relative_to(run).as_posix() for f in files] == [
        "iter000010-000011/rank00000_node0_pid40.pt.trace.json.gz",
        "iter000010-000011/rank00001_node0_pid41.pt.trace.json.gz",
        "iter000020-000021/rank00000_node0_pid40.pt.trace.json.gz",
        "iter000020-000021/rank00001_node0_pid41.pt.trace.json.gz",
    ]
    cycles = group_by_cycle(files)
    assert [(Path(c.label).name, c.iterations, len(c.files)) for c in cycles] == [
        ("iter000010-000011", (10, 11), 2), ("iter000020-000021", (20, 21), 2)]
    assert expand([run / "iter000020-000021"]) == files[2:]
    assert expand([run / "iter000020-000021", files[2]]) == files[2:]  # no repeats
    # The flat layout of older runs: cycles from the names' _iterA-B suffix.
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in files:
        shutil.copy(f, flat / f"{f.name.split('.')[0]}_{f.parent.name}.pt.trace.json.gz")
    assert [c.iterations for c in group_by_cycle(expand([flat]))] == [(10, 11), (20, 21)]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no .json or .json.gz trace files"):
        expand([tmp_path / "empty"])


@pytest.mark.slow
def test_sidecars_give_what_parsing_gives(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    parsed = _cli("summary", "--json", "--reparse", str(run))
    assert parsed.returncode == 0, parsed.stderr
    wrote = _cli("summary", "--write-sidecars", str(run))
    assert wrote.returncode == 0, wrote.stderr
    assert "4 of 4 trace(s): 4 sidecar(s) written" in wrote.stdout
    sidecars = sorted(p.relative_to(run).as_posix() for p in run.rglob("*.summary.json"))
    assert sidecars == [f"{c}/summaries/rank0000{r}_node0_pid4{r}.summary.json"
                        for c in ("iter000010-000011", "iter000020-000021") for r in (0, 1)]
    from_sidecars = _cli("summary", "--json", str(run))
    assert from_sidecars.returncode == 0 and "parsed" not in from_sidecars.stderr
    assert from_sidecars.stdout == parsed.stdout
    lines = [json.loads(line) for line in parsed.stdout.splitlines()]
    assert [("cross_rank" in x, x.get("rank")) for x in lines] == [(False, 0), (False, 1), (True, None)] * 2
    # --top is served from the sidecar's complete lists.
    assert _cli("summary", "--json", "--top", "3", str(run)).stdout == \
        _cli("summary", "--json", "--top", "3", "--reparse", str(run)).stdout
    again = _cli("summary", "--write-sidecars", str(run))
    assert "0 sidecar(s) written" in again.stdout and "4 already up to date" in again.stdout


@pytest.mark.slow
def test_a_sidecar_is_used_only_while_it_matches_and_another_version_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "rank00000_h_pid1.pt.trace.json.gz"
    shutil.copy(RANKS_128[0], trace)
    summary = summarize(load_trace(trace), top=None)
    write_sidecar(trace, {"summary": summary})
    found = read_results(trace, (SUMMARY,), top=30)
    assert found is not None and found.summary is not None
    assert found.summary.top_kernels == summarize(load_trace(trace)).top_kernels
    doc = json.loads(sidecar_path(trace).read_text())
    assert doc["version"] == formats.SIDECAR.version and doc["trace"]["size"] == trace.stat().st_size
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))  # rewritten since
    assert read_results(trace, (SUMMARY,)) is None
    write_sidecar(trace, {"summary": summary})
    assert read_results(trace, (SUMMARY,)) is not None
    # A sidecar of another version (an older torchprof-args's) is passed over: the trace is parsed,
    # and one line says why
    sidecar_path(trace).write_text(json.dumps({**doc, "version": formats.SIDECAR.version - 1}))
    assert read_results(trace, (SUMMARY,)) is None
    proc = _cli("summary", "--json", str(trace))
    assert proc.returncode == 0 and json.loads(proc.stdout)["rank"] == 0
    assert proc.stderr.splitlines() == [
        f"torchprof summary: 1 trace(s) parsed again: their sidecars were written by another version of "
        f"torchprof-args (sidecar version {formats.SIDECAR.version - 1}, "
        f"this one reads {formats.SIDECAR.version}); "
        "`torchprof summary --write-sidecars` rewrites them"]
    sidecar_path(trace).write_text("{truncated")  # not a sidecar: parsed, nothing to say
    assert read_results(trace, (SUMMARY,)) is None
    proc = _cli("summary", "--json", str(trace))
    assert proc.returncode == 0 and json.loads(proc.stdout)["rank"] == 0 and not proc.stderr


def test_shards_cover_every_trace_once(tmp_path: Path) -> None:
    files = []
    for i in range(11):
        f = tmp_path / f"rank{i:05d}.pt.trace.json"
        f.write_bytes(b" " * (1000 + 37 * ((i * 7) % 11)))
        files.append(f)
    shares = [shard_files(files, k, 3) for k in range(3)]
    assert sorted(sum(shares, [])) == sorted(files)
    assert all(set(a).isdisjoint(b) for i, a in enumerate(shares) for b in shares[i + 1:])
    loads = [sum(f.stat().st_size for f in share) for share in shares]
    assert max(loads) - min(loads) <= 1000 + 37 * 10  # balanced by bytes within one file
    # listing order does not matter
    assert shard_files(list(reversed(files)), 1, 3) == list(reversed(shares[1]))
    assert parse_shard("2/5") == (2, 5)
    both = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "RANK": "0", "WORLD_SIZE": "2"}
    assert parse_shard("auto", both) == (3, 8)
    assert parse_shard("auto", {"RANK": "1", "WORLD_SIZE": "2"}) == (1, 2)
    for bad, message in (("5/5", "0..N-1"), ("a/b", "expected K/N"), ("auto", "neither SLURM_PROCID")):
        with pytest.raises(TraceError, match=message):
            parse_shard(bad, {})


@pytest.mark.slow
def test_sharded_sidecar_writing_on_the_command_line(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    outputs = [_cli("summary", "--write-sidecars", "--shard", f"{k}/3", str(run)) for k in range(3)]
    assert all(p.returncode == 0 for p in outputs), [p.stderr for p in outputs]
    written = sum(int(p.stdout.split("sidecar(s) written")[0].rsplit(":", 1)[1]) for p in outputs)
    assert written == 4 and len(list(run.rglob("*.summary.json"))) == 4
    assert outputs[0].stdout.startswith("shard 0/3: ")
    env_run = subprocess.run(
        [sys.executable, "-m", "torchprof_args", "summary", "--write-sidecars", "--shard", "auto", str(run)],
        capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "SLURM_PROCID": "1", "SLURM_NTASKS": "3"})
    assert env_run.returncode == 0 and env_run.stdout.startswith("shard 1/3: ")
    bad = _cli("summary", "--shard", "0/2", str(run))
    assert bad.returncode == 2 and "add --write-sidecars" in bad.stderr and bad.stderr.count("\n") == 1


def _many(n: int, seed: int = 3) -> list[Summary]:
    """``n`` ranks' summaries: the real 128-rank job's two ranks with perturbed step times and work
    (ranks 5 and 6 work 12 % longer)."""
    base = [summarize(load_trace(p)) for p in RANKS_128]
    rng = random.Random(seed)
    out = []
    for rank in range(n):
        s = base[rank % 2]
        factor = rng.uniform(0.98, 1.02) * (1.12 if rank in (5, 6) else 1.0)
        assert s.step_mean_us is not None and s.work_mean_us is not None
        out.append(replace(s, rank=rank, host=f"node{rank // 8:02d}",
                           parallel={"dp": rank // 4, "tp": rank % 4},
                           steps=[replace(x, dur_us=x.dur_us * factor) for x in s.steps],
                           step_mean_us=s.step_mean_us * factor, work_mean_us=s.work_mean_us * factor,
                           file=f"rank{rank:05d}.pt.trace.json.gz"))
    return out


def test_cross_rank_view_for_many_ranks() -> None:
    import numpy as np

    summaries = _many(64)
    view = cross_rank(summaries, k=4)
    means = [s.step_mean_us for s in summaries]
    d = view.distributions.step_mean_us
    assert (d.min, d.max, d.n) == (min(means), max(means), 64)
    assert d.p50 == pytest.approx(np.percentile(means, 50))
    assert d.p90 == pytest.approx(np.percentile(means, 90))
    assert [r.rank for r in view.slowest[:2]] in ([5, 6], [6, 5])
    assert [r.rank for r in view.stragglers] in ([5, 6], [6, 5])
    assert view.fastest[0].work_mean_us == min(s.work_mean_us or 0.0 for s in summaries)
    assert len(view.fastest) == 4
    text = format_cross_rank(view, "cycle")
    assert "4 slowest ranks:" in text and "4 fastest ranks:" in text and "(56 more; --all-ranks" in text
    assert " dp  tp " in text and "node00" in text
    assert text.count("rank0") == 8  # k slowest + k fastest lines, not 64
    assert format_cross_rank(view, "cycle", all_ranks=True).count("rank0") == 64


def test_parallel_coordinates_from_megatron_process_groups() -> None:
    info = {"rank": 5, "pg_config": [
        {"pg_desc": "default_pg", "ranks": list(range(8))},
        {"pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [4, 5]},
        {"pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": [1, 5]},
        {"pg_desc": "DATA_PARALLEL_GROUP", "ranks": [5, 7]},
        {"pg_desc": "DATA_PARALLEL_GROUP_GLOO", "ranks": [5, 7]},
    ]}
    assert parallel_from_pg_config(info) == {"dp": 0, "tp": 1, "pp": 1}
    world_only = {"rank": 0, "pg_config": [{"pg_desc": "default_pg", "ranks": [0, 1]}]}
    assert parallel_from_pg_config(world_only) is None


@pytest.mark.slow
def test_report_for_1024_ranks_is_small_and_complete() -> None:
    summaries = _many(1024)
    page = render_report([("iter000100-000101", summaries, cross_rank(summaries))])
    assert len(page.encode()) < 3e6
    assert page.count("<svg") >= 5  # heatmap, 3 histograms, kernel classes
    first_column = re.findall(r'<rect x="62" y="[\d.]+" width="[\d.]+" height="([\d.]+)" fill="#', page)
    assert len(first_column) == 1024 and set(first_column) == {"1.05"}  # a row per rank, one pixel high
    stragglers = page.split("<h3>Stragglers</h3>")[1].split("<h3>")[0]
    assert stragglers.count("<tr>") == 3  # header, ranks 5 and 6
    assert "<td class=n>5</td>" in stragglers and "<td class=n>6</td>" in stragglers
    assert "All 1024 ranks" in page
    assert "http" not in page.replace("http://www.w3.org", "")


def _hta_ops(path: Path, device: str, folder: Path) -> tuple[dict[tuple[str, str], tuple[int, float]], int]:
    """Per (category, name) on the CPU, per name on the GPU: calls and total duration inside
    every ProfilerStep, by HTA's TraceDiff; the number of steps."""
    from hta.trace_diff import DeviceType, LabeledTrace

    folder.mkdir()
    shutil.copy(path, folder / path.name)
    trace = LabeledTrace(label=path.name, trace_dir=str(folder))
    ops = trace.get_ops_summary(trace.extract_ops(iteration=trace.iterations(),
                                                  device_type=DeviceType[device]))
    out: dict[tuple[str, str], tuple[int, float]] = {}
    columns = (ops["cat"], ops["name"], ops["counts"], ops["total_duration"])
    for cat, name, calls, total in zip(*columns, strict=True):
        key = (cat if device == "CPU" else "", name)  # GPU: kernels, memcpy and memset together
        if device == "GPU" and cat == "gpu_user_annotation":
            continue
        c, t = out.get(key, (0, 0.0))
        out[key] = (c + int(calls), t + float(total))
    return out, len(trace.iterations())


@pytest.mark.slow
@pytest.mark.parametrize("pair", [CPU_CYCLES, [GPU_2RANK, RANKS_128[0]]],
                         ids=["two_cycles_one_job", "two_jobs"])
def test_diff_agrees_with_hta_trace_diff(pair: list[Path], tmp_path: Path) -> None:
    pytest.importorskip("hta")
    logging.getLogger("hta").setLevel(logging.ERROR)
    proc = _cli("diff", "--json", str(pair[0]), str(pair[1]))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for side, path in (("base", pair[0]), ("new", pair[1])):
        for key, device in (("kernels", "GPU"), ("operators", "CPU")):
            hta, steps = _hta_ops(path, device, tmp_path / f"{side}_{key}")
            rows = [r for r in result[key] if r[f"{side}_calls"] is not None]
            assert rows or not any(not n.startswith("ProfilerStep") for _, n in hta)
            for r in rows:  # HTA counts every CPU category; ours are the operator tree's
                calls, total = hta[(r["kind"] if key == "operators" else "", r["name"])]
                assert r[f"{side}_calls"] * steps == pytest.approx(calls), r["name"]
                # HTA keeps integer microseconds per event.
                assert r[f"{side}_us"] * steps == pytest.approx(total, abs=2.0 * calls + 1e-6), r["name"]
    statuses = {r["status"] for r in result["kernels"] + result["operators"]}
    if pair == CPU_CYCLES:
        assert result["kernels"] == [] and "changed" in statuses
        gloo = next(r for r in result["operators"] if r["name"] == "gloo:all_reduce")
        assert gloo["delta_us"] > 0 and result["operators"][0]["name"] == "gloo:all_reduce"
    else:
        assert {"added", "removed", "changed"} <= statuses
        deltas = [abs(r["delta_us"]) for r in result["kernels"]]
        assert deltas == sorted(deltas, reverse=True)
        assert any(m["name"] == "kernel time per step: communication" for m in result["metrics"])
    text = _cli("diff", str(pair[0]), str(pair[1]), "--rows", "5")
    assert text.returncode == 0 and "BASE" in text.stdout and "by time cost (+) or saving (-)" in text.stdout


@pytest.mark.slow
def test_diff_of_run_folders_uses_sidecars(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    assert _cli("summary", "--write-sidecars", str(run)).returncode == 0
    proc = _cli("diff", "--json", str(run / "iter000010-000011"), str(run / "iter000020-000021"))
    assert proc.returncode == 0 and "parsed" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result["base"]["ranks"] == [0, 1] and result["base"]["traces"] == 2
    assert {r["status"] for r in result["kernels"] + result["operators"]} == {"unchanged"}
    assert all(m["delta"] == pytest.approx(0.0) for m in result["metrics"] if m["delta"] is not None)


@pytest.mark.slow
def test_merge_and_split_take_folders(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    out = tmp_path / "merged.json.gz"
    proc = _cli("merge", str(run / "iter000010-000011"), "-o", str(out))
    assert proc.returncode == 0 and "rank 0:" in proc.stdout and "rank 1:" in proc.stdout and out.exists()
    proc = _cli("merge", str(run), "-o", str(out))
    assert proc.returncode == 2 and "2 profiled cycles" in proc.stderr
    proc = _cli("split", str(run / "iter000010-000011"), "--max-mb", "1")
    assert proc.returncode == 0 and len(list((run / "iter000010-000011").glob("*.split"))) == 2
    assert len(expand([run / "iter000010-000011"])) == 2  # the pieces are not traces of the cycle
