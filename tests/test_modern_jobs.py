"""The jobs users launch in 2026 (issue 35), real on 2 gloo ranks: FSDP2 (``fully_shard``), the same
with each block compiled, and an expert-parallel MoE whose tokens travel by all-to-all
(tests/jobs/modern_job.py).  Every command reads their traces without a traceback; FSDP2's
reduce-scatter is named as one (gloo runs it as an all-reduce); PyTorch's internal errors reach the
user as one line; the MoE router's imbalance is ``expert_imbalance`` on the overloaded rank, on the
critical path, and neither a balanced router nor FSDP2 gives one."""

from __future__ import annotations

import gzip
import inspect
import itertools
import json
import os
import re
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers.examples import run_doc_example
from helpers.megatron_lm import CPU_HELPER, megatron_lm_trees
from helpers.paths import DATA, REPO
from helpers.processes import rank_results, run_torchrun

from torchprof_args.analysis import load_trace
from torchprof_args.analysis.analyzers.fsdp import FSDP2_STEP_PHASES, annotation_phases
from torchprof_args.analysis.analyzers.steps import steps
from torchprof_args.analysis.collect.trace_results import CRITICAL_PATH, read_results
from torchprof_args.analysis.critical_path.cycle import Scenario, cycle_graph, expert_work_per_step, mean_into
from torchprof_args.analysis.diagnose.expert_tokens import (
    MEGATRON_TPE,
    TORCHTITAN_TOKENS,
    expert_tokens_beside,
)
from torchprof_args.analysis.diagnose.kinds.exposed_comm import FSDP2_REMEDY, fsdp2_exposed
from torchprof_args.analysis.memory.findings import findings_of
from torchprof_args.analysis.memory.trace_memory import trace_memory_part
from torchprof_args.analysis.trace import Trace
from torchprof_args.console import main as torchprof
from torchprof_args.naming import EXPERT_TOKENS_SUBDIR, cycle_of_name
from torchprof_args.shared.expert_tokens_file import load_expert_tokens

JOB = REPO / "tests" / "jobs" / "modern_job.py"
COMMANDS = ("summary", "diagnose", "critical-path", "collectives", "mem")
TRACE_FLAGS = ("--torch-profile", "--torch-profile-ranks", "all", "--torch-profile-active", "2",
               "--torch-profile-record-shapes", "--torch-profile-profile-memory",
               "--torch-profile-with-stack")


def _run(shape: str, folder: Path, *flags: str) -> Path:
    result = run_torchrun(JOB, "--shape", shape, "--result-dir", str(folder),
                          "--torch-profile-dir", str(folder / "prof"), *(flags or TRACE_FLAGS), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(rank_results(folder)) == [0, 1]
    exit_line = [line for line in result.stderr.splitlines() if "at exit:" in line]
    assert exit_line and "none failed" in exit_line[-1], result.stderr[-3000:]
    return folder / "prof"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """The traces of a job of each shape (with :data:`TRACE_FLAGS`, or the flags given), run once for
    the module."""
    runs: dict[tuple[str, ...], Path] = {}

    def of(shape: str, *flags: str) -> Path:
        if (shape, *flags) not in runs:
            runs[(shape, *flags)] = _run(shape, tmp_path_factory.mktemp(shape), *flags)
        return runs[(shape, *flags)]

    return of


@pytest.fixture(params=["fsdp2", "fsdp2-compiled", "moe"])
def job(request: pytest.FixtureRequest, traced: Callable[..., Path]) -> tuple[str, Path]:
    return request.param, traced(request.param)


@pytest.mark.slow
def test_every_command_reads_the_job_in_one_piece(job: tuple[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    shape, prof = job
    for command in COMMANDS:
        assert torchprof([command, str(prof), "--no-progress"]) == 0, (shape, command)
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err and out.strip(), (shape, command, err[-2000:])
        # PyTorch's memory profiler asserts with its whole tensor-version table: kept out of the line
        assert "{id=" not in out + err and "DataFlowEdge" not in out + err, (shape, command)


@pytest.mark.slow
def test_the_collectives_are_named_as_the_job_asked(job: tuple[str, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    shape, prof = job
    assert torchprof(["collectives", str(prof), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    kinds = {instance["kind"] for instance in report["instances"]}
    if shape == "moe":  # dispatch, combine and the split sizes by all-to-all; the dense gradients
        assert kinds == {"all_to_all", "all_reduce"}, kinds
    else:  # FSDP2: parameters all-gathered, gradients reduce-scattered (run by gloo as an all-reduce)
        assert kinds == {"all_gather", "reduce_scatter"}, kinds


@pytest.mark.slow
def test_the_moe_all_to_all_says_what_each_rank_moved(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The collectives guide's MoE example, verbatim: the router sends 80 % of the tokens to rank 1's
    experts, so rank 1 receives most in the dispatch and sends most back in the combine; every byte
    sent is received (the split sizes read right)."""
    proc = run_doc_example("collectives-moe", tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Variable-size all-to-all" in proc.stdout and "sent + received / mean" in proc.stdout
    rows = proc.stdout[proc.stdout.index("sent + received / mean"):].splitlines()[1:3]
    assert [row.split()[0] for row in rows] == ["1", "0"], rows
    assert torchprof(["collectives", str(tmp_path / "prof"), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    variable = [i for i in report["instances"] if i["bytes_by_rank"]]
    assert len(variable) >= 8  # dispatch, combine and the experts' ids, 2 layers, 2 steps (and backward)
    for instance in variable:
        pairs = instance["bytes_by_rank"].values()
        assert sum(sent for sent, _ in pairs) == sum(received for _, received in pairs), instance
        assert instance["bytes"] == max(max(pair) for pair in pairs)
    heaviest, lightest = report["all_to_all_by_rank"]
    assert heaviest["rank"] == 1 and heaviest["traffic_vs_mean"] > 1.2
    assert heaviest["received_bytes"] > 2 * lightest["received_bytes"]


@pytest.mark.slow
def test_a_functional_collective_s_wait_is_waiting_on_the_path(traced: Callable[..., Path],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The MoE dispatch and combine wait in ``_c10d_functional::wait_tensor`` until gloo's all-to-all
    is done: the path goes through the collective, not through the wait as if it were work."""
    assert torchprof(["critical-path", str(traced("moe")), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    # a wait that found its collective done costs microseconds; one that waited is not work
    waited = sum(item["ms_per_step"] for item in report["top"]
                 if "wait_tensor" in item["name"] and item["category"] != "communication")
    assert waited < 0.5, report["top"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["fsdp2", "fsdp2-compiled"])
def test_fsdp2_s_shards_and_adamw_state_are_what_each_rank_holds(shape: str, traced: Callable[..., Path],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Each rank holds its parameters' shards and AdamW's state for them (2x): within 10 % of the
    job's own count (``to_local()`` of every sharded parameter), whoever categorised the memory."""
    prof = traced(shape)
    assert torchprof(["mem", str(prof), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    truth = rank_results(prof.parent)
    for row in report["ranks"]:
        expected = truth[row["rank"]]
        for category in ("parameter", "optimizer_state"):
            measured = row["by_category"][category]
            assert abs(measured - expected[f"{category}_bytes"]) <= 0.1 * expected[f"{category}_bytes"], (
                row["rank"], category, measured, expected)


@pytest.mark.slow
def test_summary_shows_fsdp2_s_phases_per_module(job: tuple[str, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """FSDP2's annotations summed per phase: all-gathers and reduce-scatters of the 4 blocks, in a
    step's order; the MoE job (no fully_shard) has none."""
    shape, prof = job
    assert torchprof(["summary", str(prof), "--json", "--no-progress"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"fsdp"' in line]
    assert docs
    for doc in docs:
        phases = {p["phase"]: p for p in doc["fsdp"]}
        if shape == "moe":
            assert phases == {}
            continue
        order = [p["phase"] for p in doc["fsdp"]]
        assert order.index("pre_forward") < order.index("pre_backward") < order.index("post_backward_reduce")
        for phase in ("all_gather", "post_backward_reduce"):
            assert set(phases[phase]["modules"]) == {f"blocks.{i}" for i in range(4)}, phases[phase]
            assert phases[phase]["ms_per_step"] > 0 and phases[phase]["calls"] >= 8
    assert torchprof(["summary", str(prof), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert ("FSDP2 annotations per step" in out) is ("Step by FSDP2 phase" in out) is (shape != "moe")


def _fsdp2_step_by_brute_force(trace: Trace) -> dict[str, float]:
    """The trace's mean step by FSDP2 phase (ms) the slow way: at the middle of every stretch between
    two boundaries of FSDP2's annotations and steps, each thread's innermost open annotation (the
    latest to start, the shortest), the first phase of FSDP2_STEP_PHASES over the threads."""
    names = list(FSDP2_STEP_PHASES)
    code = annotation_phases(trace)
    rows = [int(r) for r in np.flatnonzero(code[trace.name_id] >= 0)]
    spans = [(float(trace.ts[r]), float(trace.ts[r] + trace.dur[r]), int(trace.thread_id[r]),
              int(code[trace.name_id[r]])) for r in rows]
    step_list = steps(trace)
    bounds = sorted({t for a, b, _, _ in spans for t in (a, b)}
                    | {t for s in step_list for t in (s["start_us"], s["start_us"] + s["dur_us"])})
    found = dict.fromkeys(names, 0.0)
    for lo, hi in itertools.pairwise(bounds):
        mid = (lo + hi) / 2
        if not any(s["start_us"] <= mid <= s["start_us"] + s["dur_us"] for s in step_list):
            continue
        innermost: dict[int, tuple[float, float, int]] = {}
        for a, b, thread, phase in spans:  # the innermost: the latest start, then the earliest end
            if a <= mid <= b and (a, -b) >= innermost.get(thread, (-np.inf, -np.inf, 0))[:2]:
                innermost[thread] = (a, -b, phase)
        phases = [phase for _, _, phase in innermost.values()]
        found[names[min(phases)] if phases else "outside_fsdp"] += hi - lo
    return {k: v / len(step_list) / 1e3 for k, v in found.items()}


@pytest.mark.slow
def test_the_step_by_fsdp2_phase_adds_up_to_the_step(job: tuple[str, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``summary``'s step by FSDP2 phase: the phases add up to the mean step, each is what a brute
    force over the trace's annotations finds, all-gathers and reduce-scatters take time; the MoE
    job (no fully_shard) has none."""
    shape, prof = job
    assert torchprof(["summary", str(prof), "--json", "--no-progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    docs = [doc for doc in lines if "fsdp_step" in doc]  # each rank's summary (not the cross-rank view)
    assert len(docs) == 2
    for doc in docs:
        split = doc["fsdp_step"]
        if shape == "moe":
            assert split is None
            continue
        assert list(split["by_phase"]) == list(FSDP2_STEP_PHASES)
        assert sum(split["by_phase"].values()) == pytest.approx(split["step_ms"], abs=1e-3)
        assert split["step_ms"] == pytest.approx(doc["step_mean_us"] / 1e3, abs=1e-3)
        assert split["by_phase"]["unshard"] > 0 and split["by_phase"]["reduce_scatter"] > 0
        assert split["by_phase"]["reshard"] > 0 and split["by_phase"]["outside_fsdp"] > 0
        slow = _fsdp2_step_by_brute_force(load_trace(doc["file"]))
        assert split["by_phase"] == pytest.approx(slow, abs=2e-3), (split, slow)
    assert torchprof(["summary", str(prof), "--no-progress"]) == 0  # every rank's, in the cross-rank view
    out = capsys.readouterr().out
    assert ("step by FSDP2 phase (ms per step" in out) is (shape != "moe")
    if shape != "moe":
        table = out[out.index("step by FSDP2 phase (ms per step"):].splitlines()[2:4]
        for line, doc in zip(table, sorted(docs, key=lambda d: d["rank"]), strict=True):
            figures = [float(x) for x in line.split()]
            assert figures[0] == doc["rank"]
            assert figures[-1] == pytest.approx(doc["fsdp_step"]["step_ms"], abs=0.01)
            assert sum(figures[1:-1]) == pytest.approx(figures[-1], abs=0.03)


@pytest.mark.slow
def test_the_critical_path_by_fsdp2_phase_adds_up_to_the_path(job: tuple[str, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Each step's path by FSDP2 phase adds up to the path; every all-gather the ranks ran is in the
    unshard phase and every reduce-scatter in reduce_scatter (the sidecars' records), and both are
    on the path; the MoE job's path has no phases."""
    shape, prof = job
    assert torchprof(["critical-path", str(prof), "--json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["steps"]) == 2
    for step in doc["steps"]:
        if shape == "moe":
            assert step["by_phase"] == {}
            continue
        assert sum(step["by_phase"].values()) == pytest.approx(step["path_ms"], abs=0.01), step
        assert step["by_phase"]["unshard"] > 0 and step["by_phase"]["reduce_scatter"] > 0, step
    for path in sorted(prof.glob("iter*/*.pt.trace.json.gz")):
        stored = read_results(path, [CRITICAL_PATH])
        assert stored is not None and stored.critical_path is not None
        part = stored.critical_path
        if shape == "moe":
            assert part.record_phases == [] and all(p.by_phase == [] for p in part.step_pieces)
            continue
        kinds = [r.kind for r in part.collectives.records()]
        names = list(FSDP2_STEP_PHASES)
        by_kind = {(kind, names[c]) for kind, c in zip(kinds, part.record_phases, strict=True)}
        assert by_kind == {("all_gather", "unshard"), ("reduce_scatter", "reduce_scatter")}, by_kind
        for piece in part.step_pieces:
            assert sum(piece.by_phase) == pytest.approx(sum(piece.by_category), abs=0.01)



_UNITS = {"s": 1e3, "ms": 1.0, "us": 1e-3}


@pytest.mark.slow
def test_the_critical_path_guide_s_fsdp2_example(tmp_path: Path) -> None:
    """The critical-path guide's FSDP2 example, verbatim: the summary's phases add up to the step it
    names, each step's path by phase to the path, and unshard and reduce_scatter are on it."""
    proc = run_doc_example("critical-path-fsdp2", tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Step by FSDP2 phase"))
    step = re.search(r"the ([\d.]+)(ms|us|s) step", lines[head])
    assert step, lines[head]
    rows = [re.match(r"\s+([\d.]+)(ms|us|s)\s+[\d.]+ %\s+(\w+)", line) for line in lines[head + 1:head + 6]]
    phases = {m.group(3): float(m.group(1)) * _UNITS[m.group(2)] for m in rows if m}
    assert list(phases) == list(FSDP2_STEP_PHASES)
    assert sum(phases.values()) == pytest.approx(float(step.group(1)) * _UNITS[step.group(2)], abs=0.01)
    paths = re.findall(r"path ([\d.]+) ms \(difference", proc.stdout)
    by_phase = re.findall(r"by FSDP2 phase: (.*)", proc.stdout)
    assert len(paths) == len(by_phase) == 2, proc.stdout
    for path, shares in zip(paths, by_phase, strict=True):
        found = {name: float(ms) for name, ms in re.findall(r"([a-z ]+?) ([\d.]+) \(\d+ %\)(?:, |$)", shares)}
        assert sum(found.values()) == pytest.approx(float(path), abs=0.3), shares
        assert found["unshard"] > 0 and found["reduce scatter"] > 0, shares

def test_fsdp2_s_remedies_name_its_own_methods_and_arguments() -> None:
    """Each FSDP2 remedy names only methods torch's ``FSDPModule`` has and arguments ``fully_shard``
    takes (the torch the tests run)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    arguments = inspect.signature(fully_shard).parameters
    for text in FSDP2_REMEDY.values():
        methods = re.findall(r"\b(set_\w+)\(", text)
        assert methods and all(hasattr(FSDPModule, m) for m in methods), methods
        assert all(a in arguments for a in re.findall(r"(\w+)=", text)), text
    assert "set_modules_to_forward_prefetch" in FSDP2_REMEDY["all_gather"]
    assert "reshard_after_forward=False" in FSDP2_REMEDY["all_gather"]
    assert "set_requires_gradient_sync" in FSDP2_REMEDY["reduce_scatter"]


@pytest.mark.slow
def test_fsdp2_gets_fsdp2_s_advice_and_no_advice_to_shard_it(traced: Callable[..., Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The FSDP2 job's ranks are FSDP2's for exposed_comm's remedy (a DDP trace is not); ``mem`` does
    not advise sharding its optimizer state or gradients (FSDP2 shards them), which the same breakdown
    would get were the job not FSDP2's."""
    prof = traced("fsdp2")
    kernels = ["ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_RING_LL"]
    ddp = load_trace(DATA / "cpu_2rank_ddp_rank0.json.gz")
    assert fsdp2_exposed(ddp, kernels, [1.0, 3.0]) is None
    paths = sorted(prof.glob("iter*/*.pt.trace.json.gz"))
    assert len(paths) == 2
    for path in paths:
        trace = load_trace(path, memory_rows=True, comms=True)
        assert fsdp2_exposed(trace, kernels, [1.0, 3.0]) == {"reduce_scatter": 3.0, "all_gather": 1.0}
        part = trace_memory_part(trace)
        assert part.fsdp2 and part.devices
        unsharded = {f.kind for f in findings_of(part.devices[0], part.rank, 2)}
        assert "optimizer_sharding" in unsharded, unsharded
        assert not {f.kind for f in findings_of(part.devices[0], part.rank, 2, fsdp2=True)} & {
            "optimizer_sharding", "gradient_sharding"}
    assert torchprof(["mem", str(prof), "--json", "--no-progress"]) == 0
    kinds = {f["kind"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert kinds and not kinds & {"optimizer_sharding", "gradient_sharding"}, kinds


#: the MoE job with expert work measurable beside its dense parts (rank 1's experts get ~90 % of the
#: tokens: 80 % routed there, half of the rest by the router's own choice), 4 steps traced with the
#: shapes (the all-to-alls' sizes) and nothing that slows the step (memory, stacks).  The experts also
#: take 50 us per token received (as an accelerator's kernels would, no CPU core taken): on a loaded
#: 2-core host the two ranks' compute shares the cores and rank 1's extra work alone did not always show.
HEAVY_MOE = ("--dim", "512", "--batch", "1024", "--iters", "8", "--expert-us-per-token", "50",
             "--torch-profile", "--torch-profile-ranks",
             "all", "--torch-profile-record-shapes", "--torch-profile-skip-first", "2",
             "--torch-profile-active", "4")


def _diagnosis(prof: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert torchprof(["diagnose", str(prof), "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_summary_names_the_overloaded_rank_not_the_one_that_waits(traced: Callable[..., Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The MoE job's rank 0 waits in the all-to-alls for rank 1, whose experts get most tokens: its
    step is as long or longer, so step times would name rank 0.  ``summary``'s cross-rank view scores
    the work and names rank 1, the rank ``diagnose``'s top finding names."""
    prof = traced("moe", *HEAVY_MOE)
    assert torchprof(["summary", str(prof), "--json", "--no-progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (view,) = [line["cross_rank"] for line in lines if "cross_rank" in line]
    assert view["slowest_rank"] == 1 and [r["rank"] for r in view["stragglers"]] == [1], view["ranks"]
    work = {r["rank"]: r["work_mean_us"] for r in view["ranks"]}
    assert work[1] > 1.2 * work[0]
    assert _diagnosis(prof, capsys)["findings"][0]["ranks"] == [1]


@pytest.mark.slow
def test_the_moe_router_s_imbalance_is_expert_imbalance_on_the_overloaded_rank(
        traced: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1's experts get most tokens: ``critical-path`` runs through rank 1, ``diagnose``'s top
    finding is ``expert_imbalance`` naming it, saved on the critical path, with the job's own token
    counts as evidence; the straggler rule leaves rank 1 to it; the what-if ``experts balanced``
    predicts the same saving, the expert work's total kept."""
    prof = traced("moe", *HEAVY_MOE)
    report = _diagnosis(prof, capsys)
    top = report["findings"][0]
    assert top["kind"] == "expert_imbalance" and top["ranks"] == [1], [
        (f["kind"], f["ranks"], f["saving_ms_per_step"], f["evidence"]) for f in report["findings"]]
    assert top["saving_basis"] == "critical path" and top["saving_ms_per_step"] > 1.0, top
    assert "Rank 1" in top["summary"] and "--moe-aux-loss-coeff" in top["remedy"]
    evidence = top["evidence"]
    tokens = {int(r): v for r, v in evidence["tokens_per_rank"].items()}
    assert evidence["tokens_measure"].startswith("tokens per dispatch")
    # the job's count: tokens its experts received per step over its 2 layers, in the traced steps
    cycle = next(prof.glob("iter*"))
    first, last = (int(n) for n in cycle.name.removeprefix("iter").split("-"))
    truth = rank_results(prof.parent)
    for rank, value in tokens.items():
        received = truth[rank]["received_tokens_per_step"][first - 1:last]
        assert value == pytest.approx(sum(received) / len(received) / 2, rel=0.01), (rank, value, received)
    assert evidence["imbalance_factor"] == pytest.approx(max(tokens.values()) / (sum(tokens.values()) / 2),
                                                         rel=0.01)
    assert evidence["imbalance_factor"] > 1.5
    assert not any(f["kind"] == "straggler" and 1 in f["ranks"] for f in report["findings"])
    assert torchprof(["critical-path", str(prof), "--json", "--no-progress",
                      "--what-if", "experts balanced"]) == 0
    paths = json.loads(capsys.readouterr().out)
    on_rank = [sum(step["by_rank"].get(rank, 0.0) for step in paths["steps"]) for rank in ("0", "1")]
    assert on_rank[1] > on_rank[0], paths["steps"]
    (balanced,) = paths["what_if"]
    # balanced: the expert work (the stretches into each combine) moved to the ranks' mean, its total kept
    stored = [read_results(p, [CRITICAL_PATH]) for p in sorted(cycle.glob("*.pt.trace.json.gz"))]
    graph = cycle_graph([r.critical_path for r in stored if r is not None and r.critical_path is not None])
    before = expert_work_per_step(graph)
    after = expert_work_per_step(graph, Scenario(into=mean_into(graph)))
    assert before[1] > 2 * before[0], before
    assert sum(after.values()) == pytest.approx(sum(before.values()), rel=1e-6)
    assert after[0] == pytest.approx(after[1], rel=1e-6), after
    # the same replay (the finding's saving never over its bound)
    assert min(balanced["saving_ms_per_step"], top["bound_ms_per_step"]) == pytest.approx(
        top["saving_ms_per_step"], abs=0.01)



def _tpe_tree() -> Path:
    """A Megatron-LM tree whose training logs tokens per expert (core_v0.19.0 on), else skip."""
    writers = [(tree, tree / "megatron" / "training" / "activation_logging.py")
               for _, tree in megatron_lm_trees()]
    trees = [tree for tree, writer in writers if writer.is_file() and "def save_tpe" in writer.read_text()]
    if not trees:
        pytest.skip("no Megatron-LM tree with --save-tokens-per-expert-interval's writer (core_v0.19.0 on): "
                    "set MEGATRON_LM_PATH")
    return trees[-1]


@pytest.mark.slow
def test_megatron_s_tokens_per_expert_name_the_hot_expert(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The MoE job's tokens per local expert, written by Megatron-LM's own tokens-per-expert logger
    beside the traces: read back, each rank's experts add up to the tokens the job counted it received
    in the traced steps, and to the all-to-alls' per-rank tokens per layer; ``expert_imbalance``
    names rank 1's busiest expert and the source."""
    tree = _tpe_tree()
    prof = tmp_path / "prof"
    result = run_torchrun(JOB, "--shape", "moe", "--result-dir", str(tmp_path), "--torch-profile-dir",
                          str(prof), "--megatron-tpe-dir", str(prof), *HEAVY_MOE, timeout=600,
                          PYTHONPATH=os.pathsep.join(map(str, (CPU_HELPER, tree, REPO, REPO / "tests"))))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    truth = rank_results(tmp_path)
    traces = sorted(prof.glob("iter*/*.pt.trace.json.gz"))
    first, last = cycle_of_name(traces[0].parent.name, folder=True) or (0, 0)
    logged = expert_tokens_beside(traces)
    assert logged is not None and logged.traced and logged.iterations == list(range(first, last + 1))
    assert logged.source == MEGATRON_TPE and sorted(logged.per_rank) == [0, 1]
    for rank, row in logged.per_rank.items():
        assert len(row) == 2  # 4 experts, 2 per rank
        steps = truth[rank]["received_tokens_per_step"]
        assert sum(row) == pytest.approx(statistics.fmean(steps[i - 1] for i in logged.iterations))
    assert logged.hottest[0] == 1 and logged.imbalance_factor > 1.5, logged
    doc = _diagnosis(prof, capsys)
    found = [f for f in doc["findings"] if f["kind"] == "expert_imbalance"]
    assert found and found[0]["ranks"] == [1], doc["findings"]
    evidence = found[0]["evidence"]
    assert evidence["expert_tokens_source"].startswith(MEGATRON_TPE)
    assert evidence["expert_imbalance_factor"] == pytest.approx(logged.imbalance_factor, abs=1e-3)
    hot_rank, hot_expert = logged.hottest
    assert next(iter(evidence["tokens_per_expert"])) == f"rank {hot_rank} expert {hot_expert}"
    assert f"rank {hot_rank}'s local expert {hot_expert}" in found[0]["summary"]
    for rank, row in logged.per_rank.items():  # 2 MoE layers: one dispatch each per step
        assert evidence["tokens_per_rank"][str(rank)] == pytest.approx(sum(row) / 2, rel=0.02)

@pytest.mark.slow
def test_torchtitan_s_tokens_per_expert_name_the_hot_expert(traced: Callable[..., Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The MoE job routed by real torchtitan MoE layers (their router biased to expert 2, rank 1's
    first), watched by the profiler: each rank's file in the cycle folder's ``expert_tokens/`` holds
    exactly the router's choices the job counted, per traced step and layer (layer 0's buffer zeroed
    each step, layer 1's never); ``diagnose`` names rank 1's expert 0 from them, each expert's tokens
    the sum over both ranks of what they routed to it."""
    pytest.importorskip("torchtitan.models.common.moe", reason="torchtitan is not installed")
    prof = traced("moe", "--titan-router", *HEAVY_MOE)
    truth = rank_results(prof.parent)
    (cycle,) = prof.glob("iter*")
    first, last = cycle_of_name(cycle.name, folder=True) or (0, 0)
    files = sorted((cycle / EXPERT_TOKENS_SUBDIR).iterdir())
    assert len(files) == 2, files
    for path in files:
        doc = load_expert_tokens(path)
        assert doc["iterations"] == list(range(first, last + 1)) and doc["ep_ranks"] == [0, 1]
        assert doc["layers"] == ["moes.0.titan", "moes.1.titan"] and doc["experts"] == 4
        assert doc["counts"] == truth[doc["rank"]]["titan_routed_per_step"][first - 1:last]
    logged = expert_tokens_beside(sorted(cycle.glob("*.pt.trace.json.gz")))
    assert logged is not None and logged.source == TORCHTITAN_TOKENS and logged.traced
    steps = range(first - 1, last)
    for rank, local in itertools.product((0, 1), (0, 1)):  # expert 2 * rank + local
        routed = [sum(truth[r]["titan_routed_per_step"][i][layer][2 * rank + local]
                      for r in (0, 1) for layer in (0, 1)) for i in steps]
        assert logged.per_rank[rank][local] == pytest.approx(statistics.fmean(routed)), (rank, local)
    assert logged.hottest == (1, 0) and logged.imbalance_factor > 1.5, logged
    doc = _diagnosis(prof, capsys)
    found = [f for f in doc["findings"] if f["kind"] == "expert_imbalance"]
    assert found and found[0]["ranks"] == [1], doc["findings"]
    evidence = found[0]["evidence"]
    assert evidence["expert_tokens_source"].startswith(TORCHTITAN_TOKENS)
    assert next(iter(evidence["tokens_per_expert"])) == "rank 1 expert 0"
    assert evidence["expert_imbalance_factor"] == pytest.approx(logged.imbalance_factor, abs=1e-3)
    assert "rank 1's local expert 0" in found[0]["summary"]
    for rank, row in logged.per_rank.items():  # the all-to-alls agree: 2 layers, one dispatch each
        assert evidence["tokens_per_rank"][str(rank)] == pytest.approx(sum(row) / 2, rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("job", [("moe", "--balanced", *HEAVY_MOE), ("fsdp2",)], ids=["balanced", "fsdp2"])
def test_a_balanced_router_or_a_job_without_experts_has_no_expert_imbalance(
        job: tuple[str, ...], traced: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    report = _diagnosis(traced(*job), capsys)
    assert not any(f["kind"] == "expert_imbalance" for f in report["findings"]), report["findings"]


def _start_overlapping_runs_swapped(cycle: Path, into: Path) -> int:
    """Copies of ``cycle``'s traces (without their sidecars) in which two gloo runs on different
    worker threads, the second issued before the first started, swap their starts: what gloo's two
    worker threads do on a loaded host (an MoE dispatch and the expert ids issued after it).
    Returns the pairs swapped."""
    into.mkdir(parents=True)
    swapped = 0
    for path in sorted(cycle.glob("*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        complete = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        runs = sorted((e for e in complete if e["name"].startswith("gloo:")), key=lambda e: e["ts"])
        issues = sorted((e for e in complete if e["name"].startswith("c10d::")), key=lambda e: e["ts"])
        moved: set[int] = set()
        for first, second in itertools.pairwise(runs):
            if (first["tid"] != second["tid"] and first["ts"] + first["dur"] > second["ts"]
                    and not {id(first), id(second)} & moved and _issued(second, issues) < first["ts"]):
                first["ts"], second["ts"] = second["ts"], first["ts"]
                moved |= {id(first), id(second)}
                swapped += 1
        (into / path.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    return swapped


def _issued(run: dict, issues: list[dict]) -> float:
    """When the operator with ``run``'s tensor issued it (the latest such operator before the run)."""
    shape = run["args"]["Input Dims"][0]
    return max(e["ts"] for e in issues if e["ts"] <= run["ts"] and shape in e["args"]["Input Dims"])


@pytest.mark.slow
def test_runs_gloo_starts_out_of_order_are_matched_as_issued(traced: Callable[..., Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """On a loaded host gloo's worker threads start the dispatch and the expert ids issued after it
    out of order: the runs are tied to their operators by their shapes and matched across ranks in
    the order issued, so the routed tokens and the finding are those of the traces as recorded."""
    cycle = next(traced("moe", *HEAVY_MOE).glob("iter*"))
    swapped = tmp_path / "swapped" / cycle.name
    # how many runs overlap so depends on the host's load (usually one pair per rank, on a busy
    # host sometimes one in all): one swapped pair is a dispatch started out of order
    assert _start_overlapping_runs_swapped(cycle, swapped) >= 1
    as_recorded = _diagnosis(cycle, capsys)["findings"][0]
    reordered = _diagnosis(swapped, capsys)["findings"][0]
    assert as_recorded["kind"] == reordered["kind"] == "expert_imbalance", reordered
    for name in ("tokens_per_rank", "all_to_alls"):
        assert reordered["evidence"][name] == as_recorded["evidence"][name], name
    assert torchprof(["collectives", str(swapped), "--json", "--no-progress"]) == 0
    for instance in (i for i in json.loads(capsys.readouterr().out)["instances"] if i["bytes_by_rank"]):
        pairs = instance["bytes_by_rank"].values()  # each byte sent is received: one all-to-all
        assert sum(sent for sent, _ in pairs) == sum(received for _, received in pairs), instance


@pytest.mark.slow
def test_compiled_regions_name_the_blocks_they_ran_for(tmp_path: Path, traced: Callable[..., Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The trace toolkit's compiled example, verbatim: each block ``torch.compile``\\ d, dynamo's
    ``Torch-Compiled Region: 0/0`` ran block 0 and its recompilation ``0/1`` the three others (one
    graph shared by 3 blocks), each once a step; their forward graphs ran for the same blocks and
    their backward graphs for the same blocks' backward (the autograd sequence number ties each
    ``CompiledFunctionBackward`` to its ``CompiledFunction``); the eager job has no compiled section."""
    proc = run_doc_example("summary-compiled", tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Torch-Compiled Region: 0/1" in proc.stdout and "[Block_1, Block_2, Block_3]" in proc.stdout
    assert torchprof(["summary", str(tmp_path / "prof"), "--json", "--no-progress"]) == 0
    (doc,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"compiled"' in line]
    steps = len(doc["steps"])
    regions = {r["name"]: r for r in doc["compiled"]["regions"]}
    assert sorted(regions["Torch-Compiled Region: 0/0"]["modules"]) == ["Block_0"]
    assert sorted(regions["Torch-Compiled Region: 0/1"]["modules"]) == ["Block_1", "Block_2", "Block_3"]
    assert regions["Torch-Compiled Region: 0/0"]["calls"] == steps
    assert regions["Torch-Compiled Region: 0/1"]["calls"] == 3 * steps
    graphs = [r for name, r in regions.items() if name.startswith("CompiledFxGraph ")]
    owners = sorted(sorted(g["modules"]) for g in graphs)  # forward and backward of each compilation
    assert owners == [["Block_0"], ["Block_0 (backward)"], ["Block_1", "Block_2", "Block_3"],
                      ["Block_1 (backward)", "Block_2 (backward)", "Block_3 (backward)"]], owners
    assert doc["compiled"]["kernels"] == []  # CPU: inductor's C++ kernels are not in the trace
    assert torchprof(["summary", str(traced("fsdp2")), "--json", "--no-progress"]) == 0
    eager = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"compiled"' in line]
    assert len(eager) == 2 and all(doc["compiled"] is None for doc in eager)
