"""``torchprof diagnose``: inputs, the JSON schema and its order, the text's length, bad input, sidecars,
and the cross-rank kinds on real traces with the problem injected (``helpers.diagnose_traces``)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from helpers.diagnose_traces import CPU_PAIR, late_pair, straggler_pair
from helpers.examples import run_doc_example
from helpers.paths import DATA, REPO

from torchprof_args.analysis.diagnose.context import Scope
from torchprof_args.analysis.diagnose.documents import CompactRecords, RankDiagnosis
from torchprof_args.analysis.diagnose.finding import Finding, Gap
from torchprof_args.analysis.diagnose.job_findings import diagnose, merge_kind
from torchprof_args.analysis.diagnose.registry import CROSS_RANK, KINDS, PER_RANK, REGISTRY
from torchprof_args.analysis.jsonout import finite
from torchprof_args.analysis.render.diagnosis import MAX_LINES, format_diagnosis
from torchprof_args.console import main as torchprof
from torchprof_args.shared import formats

FINDING_KEYS = {"kind", "ranks", "ms_per_step", "share_of_step", "saving_ms_per_step", "evidence", "remedy"}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert torchprof(["diagnose", *argv, "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def check_schema(doc: dict, ranks: int) -> None:
    assert doc["version"] == formats.FINDINGS.version and doc["ranks"] == ranks
    assert set(doc) >= {"version", "path", "ranks", "step_ms", "findings"}
    savings = [f["saving_ms_per_step"] for f in doc["findings"]]
    assert savings == sorted(savings, reverse=True)
    for f in doc["findings"]:
        assert set(f) >= FINDING_KEYS and f["kind"] in KINDS
        assert isinstance(f["ranks"], list) and isinstance(f["evidence"], dict)


def run_folder(tmp_path: Path) -> Path:
    """A run folder with two cycles of the demo's rank 0 (iterations 3 and 5)."""
    for it in (3, 5):
        cycle = tmp_path / "prof" / f"iter{it:06d}-{it:06d}"
        cycle.mkdir(parents=True)
        target = cycle / "rank00000_demo.pt.trace.json.gz"
        shutil.copy(DATA / f"cpu_2rank_gloo_rank0_iter{it}.json.gz", target)
    return tmp_path / "prof"


def documented_schema() -> dict:
    """The example of docs/guides/diagnose.md's "The JSON schema" section."""
    page = (REPO / "docs" / "guides" / "diagnose.md").read_text()
    section = page[page.index("## The JSON schema"):]
    start = section.index("```json") + len("```json")
    return json.loads(section[start:section.index("```", start)])


def test_one_trace_json_schema(capsys):
    doc = run_json(capsys, str(DATA / "gpu_2rank_nccl_rank0.json.gz"))
    check_schema(doc, 1)
    assert doc["step_ms"] > 0 and doc["path"].endswith("gpu_2rank_nccl_rank0.json.gz")
    documented = documented_schema()  # the keys, in their order, as the guide shows them
    assert list(doc) == list(documented)
    assert [list(f) for f in doc["findings"]] == [list(documented["findings"][0])] * len(doc["findings"])
    assert [list(g) for g in doc["gaps"]] == [list(documented["gaps"][0])] * len(doc["gaps"])


@pytest.mark.slow
def test_run_folder_takes_the_latest_cycle_and_cycle_picks_another(tmp_path, capsys):
    prof = run_folder(tmp_path)
    assert run_json(capsys, str(prof))["cycle"].startswith("iterations 5-5")
    assert run_json(capsys, str(prof), "--cycle", "3")["cycle"] == "iterations 3-3"
    assert run_json(capsys, str(prof / "iter000003-000003"))["ranks"] == 1
    assert torchprof(["diagnose", str(prof), "--cycle", "4"]) == 2
    assert "--cycle 4" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing", "empty", "corrupt"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    path = tmp_path / "x"
    if case == "empty":
        path.mkdir()
    elif case == "corrupt":
        path = tmp_path / "rank0.pt.trace.json.gz"
        path.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": '))
    assert torchprof(["diagnose", str(path), "--no-progress"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "Traceback" not in out.err
    assert out.err.startswith("torchprof diagnose: error: ") and str(path) in out.err


@pytest.mark.slow
def test_sidecar_gives_the_same_result_as_the_trace(tmp_path, capsys):
    pair = straggler_pair(tmp_path / "cycle", 200e3)
    parsed = run_json(capsys, str(tmp_path / "cycle"))
    assert torchprof(["summary", "--write-sidecars", "--no-progress", str(tmp_path / "cycle")]) == 0
    capsys.readouterr()
    assert all((p.parent / "summaries" / p.name.replace(".json.gz", ".summary.json")).exists() for p in pair)
    from_sidecars = run_json(capsys, str(tmp_path / "cycle"))
    assert from_sidecars == parsed
    assert run_json(capsys, str(tmp_path / "cycle"), "--reparse") == parsed


def straggler_ms(doc: dict) -> float:
    found = [f for f in doc["findings"] if f["kind"] == "straggler"]
    return found[0]["ms_per_step"] if found else 0.0


@pytest.mark.slow
def test_straggler_injected_into_a_real_cpu_pair_is_found_with_its_size_and_ranks_first(tmp_path, capsys):
    clean = run_json(capsys, str(straggler_pair(tmp_path / "clean", 0, pair=CPU_PAIR)[0].parent))
    assert straggler_ms(clean) == 0.0  # no false positive (threshold: 5 % of the step and 2 ms)
    doc = run_json(capsys, str(straggler_pair(tmp_path / "slow", 100e3, pair=CPU_PAIR)[0].parent))
    check_schema(doc, 2)
    first = doc["findings"][0]
    assert first["kind"] == "straggler" and first["ranks"] == [1]
    assert first["ms_per_step"] == pytest.approx(100.0, rel=0.10)
    assert "collective_skew" not in [f["kind"] for f in doc["findings"]]  # the skew it explains: not twice


@pytest.mark.slow
def test_straggler_injected_into_the_real_gpu_pair_adds_its_size(tmp_path, capsys):
    """Rank 1 of the 128-GPU job already arrives ~180 ms late at an all-to-all (a real straggler, which
    ``torchprof collectives`` shows too); 200 ms more work per step adds 200 ms (within 10 %)."""
    clean = run_json(capsys, str(straggler_pair(tmp_path / "clean", 0)[0].parent))
    doc = run_json(capsys, str(straggler_pair(tmp_path / "slow", 200e3)[0].parent))
    assert straggler_ms(doc) - straggler_ms(clean) == pytest.approx(200.0, rel=0.10)
    assert [f for f in doc["findings"] if f["kind"] == "straggler"][0]["ranks"] == [1]


@pytest.mark.slow
def test_late_arrival_injected_into_a_real_cpu_pair_is_collective_skew_first(tmp_path, capsys):
    """Rank 1 starts each step 50 ms late (a pause between its steps, not more work): rank 0 waits for
    it in the step's first collective.  collective_skew, ranks [1], 50 ms more than the unmodified
    pair's (within 10 %), first; no straggler (rank 1 does no more work)."""
    def skew_ms(doc: dict) -> float:
        return next((f["ms_per_step"] for f in doc["findings"] if f["kind"] == "collective_skew"), 0.0)

    clean = run_json(capsys, str(late_pair(tmp_path / "clean", 0)[0].parent))
    doc = run_json(capsys, str(late_pair(tmp_path / "late", 50e3)[0].parent))
    first = doc["findings"][0]
    assert first["kind"] == "collective_skew" and first["ranks"] == [1]
    assert skew_ms(doc) - skew_ms(clean) == pytest.approx(50.0, rel=0.10)
    assert straggler_ms(doc) == 0.0


def _finding(kind: str, rank: int, ms: float) -> Finding:
    return Finding(kind=kind, summary=f"{kind} on rank {rank}.", ranks=(rank,), ms_per_step=ms,
                   share_of_step=ms / 100, saving_ms_per_step=ms, saving_bound="its time", remedy="fix it",
                   evidence={"perfetto_ts_us": 1000.0 * rank,
                             "top": [{"name": "aten::mm", "ms_per_step": ms}]})


def test_merge_takes_the_worst_rank_and_names_every_rank():
    merged = merge_kind([_finding("gpu_idle", 3, 5.0), _finding("gpu_idle", 1, 9.0),
                         _finding("gpu_idle", 2, 7.0)], n_ranks=8, step_ms=100.0)
    assert merged.ranks == (1, 2, 3) and merged.ms_per_step == 9.0 and merged.saving_ms_per_step == 9.0
    assert merged.evidence["worst_rank"] == 1
    assert merged.evidence["per_rank_ms"] == {"ranks": 3, "min": 5.0, "median": 7.0, "max": 9.0}
    assert merged.share_of_step == pytest.approx(0.09)


def test_text_keeps_to_30_lines_with_many_findings_and_gaps():
    parts = [RankDiagnosis(format=2, rank=r, world_size=4, base_us=0.0, steps=[], step_mean_us=100e3,
                           findings=[_finding(k, r, 1.0 + i + r) for i, k in enumerate(KINDS)],
                           gaps=[Gap("host_sync", "no stacks.", "--torch-profile-with-stack"),
                                 Gap("low_mfu", "no FLOPs.", "--torch-profile-with-flops")],
                           comm_source=None, pg_config=[], collectives=CompactRecords.of([]), mfu_inputs=None)
             for r in range(4)]
    doc = diagnose(parts, "run/")
    check_schema(finite(doc), 4)
    text = format_diagnosis(doc)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES
    assert "more finding(s) in --json" in text
    assert "to see host_sync, record with --torch-profile-with-stack" in text
    assert lines[1].startswith("1. ") and "Perfetto: rank" in text


@pytest.mark.slow
def test_report_opens_with_the_findings(tmp_path, capsys):
    straggler_pair(tmp_path / "slow", 100e3, pair=CPU_PAIR)
    out = tmp_path / "report.html"
    assert torchprof(["report", str(tmp_path / "slow"), "-o", str(out), "--no-progress"]) == 0
    page = out.read_text()
    section = page.index("<h2>")
    assert page.index("What to fix (torchprof diagnose)") > section
    assert page.index("What to fix") < page.index("Step time per rank and step")
    assert "<td>straggler</td>" in page
    # CPU-only traces: five kinds lack GPU kernels, one flag records them all: said once, naming the five
    # (low_mfu is a CPU job's too, against the peak --peak-tflops gives)
    flag = "--torch-profile-activities cpu cuda"
    (gpu_gaps,) = [line for line in page.split("<li>") if f"record with {flag}" in line]
    assert page.count(flag) == 1
    assert gpu_gaps.startswith("to see gpu_idle, exposed_comm, launch_bound, host_sync, memcpy, record")


@pytest.mark.slow
def test_diff_says_which_findings_appeared_disappeared_or_changed(tmp_path, capsys):
    clean = straggler_pair(tmp_path / "clean", 0, pair=CPU_PAIR)[0].parent
    slow = straggler_pair(tmp_path / "slow", 100e3, pair=CPU_PAIR)[0].parent
    slower = straggler_pair(tmp_path / "slower", 200e3, pair=CPU_PAIR)[0].parent
    capsys.readouterr()
    assert torchprof(["diff", str(clean), str(slow), "--json", "--no-progress"]) == 0
    rows = {r["kind"]: r for r in json.loads(capsys.readouterr().out)["findings"]}
    assert rows["straggler"]["status"] == "appeared"
    assert rows["straggler"]["new_ms_per_step"] == pytest.approx(100.0, rel=0.10)
    assert torchprof(["diff", str(slow), str(clean), "--json", "--no-progress"]) == 0
    assert {r["kind"]: r for r in json.loads(capsys.readouterr().out)["findings"]}["straggler"]["status"] == \
        "disappeared"
    assert torchprof(["diff", str(slow), str(slower), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "Findings (torchprof diagnose" in text and "changed     straggler" in text


@pytest.mark.slow
def test_doc_example_on_a_real_gpu_trace(tmp_path):
    proc = run_doc_example("diagnose-gpu-trace", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("torchprof diagnose: 1 rank") and "1. launch_bound" in proc.stdout
    assert len(proc.stdout.splitlines()) <= MAX_LINES


def test_the_kinds_page_documents_the_registry_with_its_thresholds():
    """docs/guides/diagnose-kinds.md's table: every kind of the registry, in its order, with where it
    is computed and its threshold as ``Threshold.describe`` states it."""
    page = (REPO / "docs" / "guides" / "diagnose-kinds.md").read_text()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in page.splitlines()
            if line.startswith("| `")]
    assert [r[0].strip("`") for r in rows] == list(KINDS)
    for row, kind in zip(rows, REGISTRY, strict=True):
        assert row[1] == kind.SCOPE.value, row
        assert row[2].startswith(kind.THRESHOLD.describe()), (row[2], kind.THRESHOLD.describe())


def test_the_registry_orders_the_kinds_that_read_earlier_findings():
    """``low_mfu`` saves what the other per-rank kinds leave, ``straggler`` leaves the overloaded
    experts' ranks to ``expert_imbalance``, ``collective_skew`` what both do not explain: each must run
    after those."""
    assert [k.KIND for k in PER_RANK][-1] == "low_mfu"
    assert [k.KIND for k in CROSS_RANK] == ["expert_imbalance", "straggler", "collective_skew",
                                            "memory_imbalance", "mfu_disagreement"]
    scopes = [k.SCOPE for k in REGISTRY]
    assert scopes == [Scope.PER_RANK] * len(PER_RANK) + [Scope.CROSS_RANK] * len(CROSS_RANK)

