"""torchprof collectives: collectives matched across ranks on the real GPU traces of tests/data and
on a real 2-rank gloo job where one rank arrives late at one chosen all-reduce."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.examples import run_doc_example
from helpers.paths import DATA
from helpers.processes import rank_results

from torchprof_args.analysis.analyzers.collective_match import (
    MATCH_KIND_ORDER,
    MATCH_PG_ORDER,
    MATCH_SEQ,
    MATCH_STREAM_ORDER,
    CycleCollectives,
    bus_factor,
    match_collectives,
)
from torchprof_args.analysis.analyzers.collectives import (
    CommRecord,
    RankComms,
    backend_of,
    canonical_kind,
    dtype_bytes,
    match_issues,
    run_kind,
)
from torchprof_args.analysis.collect.pool import collect
from torchprof_args.analysis.collect.trace_results import DIAGNOSIS
from torchprof_args.analysis.decode.loader import load_trace
from torchprof_args.analysis.render.collectives import format_collectives
from torchprof_args.analysis.tools.collectives import collectives_report
from torchprof_args.console import main as torchprof

PAIR = [DATA / "gpu_128rank_sampled_rank0.json.gz", DATA / "gpu_128rank_sampled_rank1.json.gz"]
NCCL_2RANK = DATA / "gpu_2rank_nccl_rank0.json.gz"


def _report(paths: list[Path]) -> CycleCollectives:
    """The report as ``torchprof collectives`` makes it, through the per-trace pipeline."""
    return collectives_report(collect(paths, parts=(DIAGNOSIS,)).results, None)


def _raw_nccl_kernels(path: Path) -> list[dict]:
    """The NCCL kernels of a trace read with the json module (the independent reference)."""
    with gzip.open(path) as handle:
        events = json.load(handle)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    return sorted(kernels, key=lambda e: e["ts"])


@pytest.mark.slow
def test_loading_with_comms_keeps_the_columns_and_adds_the_side_table() -> None:
    plain, comms = load_trace(NCCL_2RANK), load_trace(NCCL_2RANK, comms=True)
    assert plain.comms is None and comms.comms
    for column in ("ts", "dur", "name_id", "cat_id", "thread_id", "stream", "corr"):
        assert np.array_equal(getattr(plain, column), getattr(comms, column)), column
    names = {row[2] for row in comms.comms}
    assert "record_param_comms" in names and "nccl:all_reduce" in names
    assert sum(1 for row in comms.comms if row[3] == "kernel") == len(_raw_nccl_kernels(NCCL_2RANK))
    parallel = load_trace(NCCL_2RANK, comms=True, workers=2)  # the worker processes carry the rows too
    assert sorted(map(repr, parallel.comms)) == sorted(map(repr, comms.comms))


@pytest.mark.slow
def test_128_rank_pair_matches_kernels_per_stream_against_the_raw_events() -> None:
    report = _report(PAIR)
    assert report["ranks"] == [0, 1] and report["world_size"] == 128
    assert report["source"] == "NCCL kernels on the GPU" and report["matched_by"] == MATCH_STREAM_ORDER
    assert any("2 of 128 ranks" in note for note in report["notes"])
    gathers = [i for i in report["instances"] if i["channel"] == "stream 203"]
    raw = [[k for k in _raw_nccl_kernels(path) if k["args"]["stream"] == 203] for path in PAIR]
    assert len(gathers) == 2 == len(raw[0]) == len(raw[1])
    for inst, k0, k1 in zip(gathers, raw[0], raw[1], strict=True):
        assert inst["kind"] == "all_gather"  # SendRecv kernels inside nccl:_all_gather_base
        assert inst["skew_us"] == pytest.approx(abs(k1["ts"] - k0["ts"]))
        last = 1 if k1["ts"] > k0["ts"] else 0
        assert inst["last_rank"] == last and inst["transfer_us"] == (k1, k0)[1 - last]["dur"]
        assert inst["dur_us"] == {0: k0["dur"], 1: k1["dur"]}
        # int8 input x world (the size is not recorded)
        assert inst["bytes"] == 16777216 * 128 and inst["bytes_assumed"]
        assert inst["algbw_gbps"] == pytest.approx(inst["bytes"] / (inst["transfer_us"] * 1e3))
        assert inst["busbw_gbps"] == pytest.approx(inst["algbw_gbps"] * 127 / 128)
        assert (inst["algorithm"], inst["protocol"]) == ("RING", "SIMPLE")
    assert {i["kind"] for i in report["instances"]} == {"all_to_all", "all_reduce", "all_gather"}
    compared = [i for i in report["instances"] if i["ranks"] == 2]
    caused = {row["rank"]: row["wait_caused_us"] for row in report["ranks_by_wait_caused"]}
    for rank in (0, 1):
        assert caused[rank] == pytest.approx(sum(i["skew_us"] for i in compared if i["last_rank"] == rank))
    text = format_collectives(report)
    assert "Ranks by the waiting they caused" in text and "all_gather #0 stream 203" in text


@pytest.mark.slow
def test_2rank_nccl_trace_reads_process_group_and_sizes_from_the_kernels() -> None:
    report = _report([NCCL_2RANK])
    assert report["matched_by"] == MATCH_PG_ORDER and report["process_groups"] == ["0"]
    raw = _raw_nccl_kernels(NCCL_2RANK)
    kinds = [canonical_kind(k["args"]["Collective name"]) for k in raw]
    assert [i["kind"] for i in report["instances"]] == kinds
    for inst, kernel in zip(report["instances"], raw, strict=True):
        args = kernel["args"]
        assert inst["bytes"] == args["In msg nelems"] * dtype_bytes(args["dtype"])
        assert inst["pg_desc"] == "default_pg" and inst["group_size"] == 2
        assert inst["transfer_us"] == kernel["dur"]
        assert inst["busbw_gbps"] == pytest.approx(inst["bytes"] / (kernel["dur"] * 1e3))  # n = 2: factor 1
    assert report["worst_skew"] == []  # one rank: nothing to compare
    assert "no collective seen by two or more ranks" in format_collectives(report)


def _record(kind: str, start: float, *, nbytes: int = 4096, pg: str | None = None, seq: int | None = None,
            channel: str = "stream 7") -> CommRecord:
    return CommRecord(kind=kind, start_us=start, dur_us=100.0, channel=channel, step="ProfilerStep#1", pg=pg,
                      seq=seq, nbytes=nbytes, group_size=3 if pg else None)


def test_matching_by_sequence_number_and_alignment_of_a_missing_record() -> None:
    by_seq = [RankComms(r, f"r{r}", "NCCL kernels on the GPU",
                        [_record("all_reduce", 1000.0 * s + (500 if r == 2 and s == 2 else r), pg="0", seq=s)
                         for s in (1, 2, 3)], 3, []) for r in range(3)]
    report = match_collectives(by_seq)
    assert report["matched_by"] == MATCH_SEQ
    second = report["instances"][1]
    assert (second["seq"], second["last_rank"], second["skew_us"]) == (2, 2, 500.0)
    assert second["wait_caused_us"] == 500.0 + 499.0
    assert report["ranks_by_wait_caused"][0]["rank"] == 2
    # no seq, no pg: rank 1's stream lacks the middle all-gather (a sampled trace); alignment keeps
    # the all-reduce after it matched instead of shifting every later record
    records = [
        [_record("all_reduce", 0), _record("all_gather", 100, nbytes=8192), _record("all_reduce", 200)],
        [_record("all_reduce", 1), _record("all_reduce", 230)],
    ]
    report = match_collectives([RankComms(r, f"r{r}", "x", recs, 2, []) for r, recs in enumerate(records)])
    assert report["matched_by"] == MATCH_STREAM_ORDER
    compared = [(i["kind"], i["ranks"], i["skew_us"]) for i in report["instances"]]
    assert compared == [("all_reduce", 2, 1.0), ("all_gather", 1, 0.0), ("all_reduce", 2, 30.0)]
    cpu = [RankComms(r, f"r{r}", "gloo", [_record("barrier", r, channel="barrier")], 2, []) for r in range(2)]
    assert match_collectives(cpu)["matched_by"] == MATCH_KIND_ORDER


def test_a_run_is_matched_to_the_operator_that_issued_it() -> None:
    """gloo runs FSDP2's one-tensor reduce-scatter as an all-reduce (another backend as itself); the
    n-th run of a kind is the n-th issue of it once that has started, a run before any is unmatched."""
    assert run_kind("c10d::_reduce_scatter_base_") == "all_reduce" == run_kind("c10d::allreduce_")
    assert run_kind("c10d::_reduce_scatter_base_", "xccl") == "reduce_scatter"
    assert run_kind("c10d::reduce_scatter_") == "reduce_scatter"
    assert backend_of(["gloo:all_reduce", "gloo:all_gather", "xccl:all_reduce"]) == "gloo"
    issues = [("all_reduce", 10.0), ("all_gather", 11.0), ("all_reduce", 12.0)]
    runs = [("all_reduce", 5.0), ("all_reduce", 10.5), ("all_gather", 11.5), ("all_reduce", 13.0)]
    assert match_issues(issues, runs) == {1: 0, 2: 1, 3: 2}
    # gloo's two worker threads start an MoE dispatch and the expert ids issued after it out of
    # order: the shapes say which is which (without them: the order of the starts)
    issues = [("all_to_all", 10.0), ("all_to_all", 11.0)]
    runs = [("all_to_all", 12.0), ("all_to_all", 11.5)]
    shapes = [frozenset({"[1889, 512]", "[1024, 512]"}), frozenset({"[1889, 1]", "[1024, 1]"})]
    assert match_issues(issues, runs, shapes, ["[1024, 512]", "[1024, 1]"]) == {0: 0, 1: 1}
    assert match_issues(issues, runs) == {1: 0, 0: 1}


def test_bus_bandwidth_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == 7 / 8
    assert bus_factor("all_to_all", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == bus_factor("send_recv", 8) == bus_factor("all_reduce", 1) == 1.0
    assert canonical_kind("nccl:_all_gather_base") == "all_gather" == canonical_kind("ALLGATHER_coalesced")
    assert canonical_kind("_reduce_scatter_base") == "reduce_scatter"
    assert canonical_kind("gloo:all_to_all") == "all_to_all"
    assert dtype_bytes("c10::BFloat16") == 2 and dtype_bytes("long int") == 8
    assert dtype_bytes("Float8_e4m3fn") == 1


def test_unknown_cycle_and_missing_input_are_one_line_errors(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert torchprof(["collectives", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert torchprof(["collectives", str(DATA), "--cycle", "5"]) == 2
    assert "--cycle 5: no traces of a cycle starting at iteration 5" in capsys.readouterr().err


@pytest.mark.slow
def test_sidecars_give_the_same_report_and_a_bad_trace_is_one_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    traces = [tmp_path / f"rank0000{r}_h_pid1.pt.trace.json.gz" for r in (0, 1)]
    for source, trace in zip(PAIR, traces, strict=True):
        shutil.copy(source, trace)
    argv = ["collectives", str(tmp_path), "--json", "--no-progress"]
    assert torchprof(argv) == 0
    parsed = capsys.readouterr().out
    assert torchprof(["summary", "--write-sidecars", "--no-progress", str(tmp_path)]) == 0
    for trace in traces:  # unreadable now, its fingerprint kept: only its sidecar can give the report
        stat = trace.stat()
        trace.write_bytes(b"x" * stat.st_size)
        os.utime(trace, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    capsys.readouterr()
    assert torchprof(argv) == 0 and capsys.readouterr().out == parsed
    bad = tmp_path / "rank00002_h_pid1.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": ')
    assert torchprof(argv) == 1  # the others are reported, the bad trace named in one line
    out = capsys.readouterr()
    assert out.out == parsed and out.err.count("\n") == 1
    assert out.err.startswith(f"torchprof collectives: {bad}: ")


@pytest.mark.slow
def test_readme_example_two_rank_gloo_job_names_the_late_rank_and_the_collective(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's example, verbatim: rank 1 sleeps 0.4 s before the 4096-float all-reduce of
    iteration 3 of a real 2-rank torchrun job."""
    proc = run_doc_example("collectives", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {r["ended"] for r in rank_results(tmp_path).values()} == {"done"}
    line = next(x for x in proc.stdout.splitlines() if "ProfilerStep#3" in x and "all_reduce #1" in x)
    assert re.search(r"16\.0 KiB +0\.4\d\d s +1 ", line), line  # size, skew, then the last rank: 1
    assert proc.stdout.index("Ranks by the waiting they caused") < proc.stdout.index("worst arrival skew")
    assert torchprof(["collectives", str(tmp_path / "prof"), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source"].startswith("gloo collectives on the CPU")
    assert report["matched_by"] == MATCH_KIND_ORDER
    assert report["cycle"] == "iterations 2-4" and report["ranks"] == [0, 1]
    worst = report["instances"][report["worst_skew"][0]]
    assert (worst["kind"], worst["bytes"], worst["step"], worst["last_rank"]) == ("all_reduce", 4096 * 4,
                                                                                   "ProfilerStep#3", 1)
    assert worst["skew_us"] >= 0.35e6 and worst["dur_us"]["0"] >= 0.35e6 > worst["dur_us"]["1"]
    assert report["ranks_by_wait_caused"][0]["rank"] == 1
    assert report["ranks_by_wait_caused"][0]["wait_caused_pct"] > 90
    # 4 per step, the job's own: the host-memory guard's votes at every recorded step stay out of the traces
    assert len(report["instances"]) == 12 and all(i["ranks"] == 2 for i in report["instances"])
