"""CUDA memory snapshots where no GPU can make one: built in the allocator's real format
(tests/helpers/snapshots.py) with known sizes, read by ``torchprof mem`` without running their code.

The OOM explanations: fragmentation (enough free memory in all, no block large enough) and real
demand (the remedy that frees at least the missing bytes, or none alone); the categories inferred
from the stacks; corrupt and truncated snapshots as one line naming the file; the streaming reader
at a million history entries."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.snapshots import MIB, long_history, training_snapshot, write

from torchprof_args.analysis.memory.snapshot import load_snapshot, summarize_snapshot
from torchprof_args.console import main

SIZES = {"params": 64 * MIB, "state": 128 * MIB, "activations": 96 * MIB}


def mem_json(capsys: pytest.CaptureFixture[str], *paths: Path) -> dict:
    capsys.readouterr()
    assert main(["mem", "--json", *map(str, paths)]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_oom_from_fragmentation_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """24 MiB asked with 2 MiB free for CUDA and 8 free blocks of 4 MiB cached: 34 MiB free in all but
    no block of 24 MiB: fragmentation, fixed by expandable segments."""
    path = write(training_snapshot(**SIZES, holes=4 * MIB, request=24 * MIB, device_free=2 * MIB),
                 tmp_path / "memory_snapshot_gpu0_rank0_iter0000007_oom.pickle")
    doc = mem_json(capsys, path)
    oom = doc["oom"]
    assert oom["cause"] == "fragmentation" and oom["requested_bytes"] == 24 * MIB
    assert oom["device_free_bytes"] == 2 * MIB and oom["cached_free_bytes"] == 8 * 4 * MIB
    assert oom["largest_free_block_bytes"] == 4 * MIB and oom["missing_bytes"] == 0
    assert oom["remedy"]["kind"] == "fragmentation" and "expandable_segments:True" in oom["remedy"]["remedy"]
    held = oom["held"]  # from the stacks: module init, Adam's _init_group, forward
    assert (held["parameter"], held["optimizer_state"], held["activation"]) == (
        SIZES["params"], SIZES["state"], SIZES["activations"])
    assert oom["site"].startswith("train.py:29") and "fragmentation" in [f["kind"] for f in doc["findings"]]
    capsys.readouterr()
    assert main(["mem", str(path)]) == 0
    text = capsys.readouterr().out
    assert "OOM: cuda:0: a request of 24.0 MiB failed" in text and "fragmentation" in text


def test_an_oom_from_demand_names_the_remedy_that_frees_enough(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """80 MiB asked with 34 MiB free in all: 46 MiB short; halving the micro-batch frees 48 MiB of the
    96 MiB of activations: enough, and the least disruptive change that is."""
    path = write(training_snapshot(**SIZES, holes=4 * MIB, request=80 * MIB, device_free=2 * MIB),
                 tmp_path / "oom.pickle")
    oom = mem_json(capsys, path)["oom"]
    assert oom["cause"] == "demand" and oom["missing_bytes"] == 46 * MIB
    assert oom["remedy"]["kind"] == "smaller_micro_batch" and oom["remedy"]["bytes_freed"] == 48 * MIB
    assert oom["remedy"]["bytes_freed"] >= oom["missing_bytes"]


def test_an_oom_no_single_change_fixes_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(training_snapshot(**SIZES, holes=4 * MIB, request=600 * MIB, device_free=2 * MIB),
                 tmp_path / "oom.pickle")
    oom = mem_json(capsys, path)["oom"]
    assert oom["cause"] == "demand" and oom["remedy"] is None
    assert all(not r["enough"] for r in oom["remedies"])
    capsys.readouterr()
    assert main(["mem", str(path)]) == 0
    assert "no single change frees the missing bytes" in capsys.readouterr().out


def test_the_history_gives_the_breakdown_over_time(tmp_path: Path) -> None:
    """The snapshot's history replayed: the peak (before the OOM) by category, from the stacks."""
    snap = training_snapshot(**SIZES, holes=4 * MIB, request=24 * MIB, device_free=2 * MIB)
    summary = summarize_snapshot(snap, "s.pickle")
    (memory,) = summary.memory
    assert memory.peak_bytes == sum(SIZES.values()) + 4 * MIB  # the last forward scratch block on top
    assert memory.by_category.activation == SIZES["activations"] and memory.by_category.temporary == 4 * MIB
    assert summary.devices[0].expandable_segments is False
    assert any("inferred from each block's Python stack" in n for n in summary.notes)


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_truncated_snapshot_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          cut: float) -> None:
    data = pickle.dumps(training_snapshot(**SIZES, holes=MIB, request=MIB, device_free=0), protocol=4)
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[: int(len(data) * cut)])
    assert main(["mem", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"torchprof mem: error: {path}: "), err
    assert "Traceback" not in err


def test_a_snapshot_of_wrong_shapes_is_read_without_error(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Plain data of unexpected shapes (a corrupt but valid pickle): skipped entries, no traceback."""
    odd = {"segments": [None, {"device": "x", "blocks": [1, {"size": "big"}]}],
           "device_traces": [[None, {"action": "alloc", "addr": -5, "size": 2**70}, {"action": "oom"}], "x"]}
    path = tmp_path / "odd.pickle"
    path.write_bytes(pickle.dumps(odd))
    doc = mem_json(capsys, path)
    assert doc["snapshots"][0]["devices"] and doc["oom"]["requested_bytes"] == 0


def test_a_trace_and_a_snapshot_that_fail_among_good_ones_exit_1(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    good = write(training_snapshot(**SIZES, holes=MIB, request=MIB, device_free=0), tmp_path / "good.pickle")
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04not a pickle")
    assert main(["mem", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err


@pytest.mark.slow
def test_a_million_history_entries_stream_through(tmp_path: Path) -> None:
    """1M allocator entries (PyTorch's format, stacks shared): read and replayed (the time and memory
    it takes are benchmarks/bench_memory.py's)."""
    path = write(long_history(1_000_000), tmp_path / "long.pickle")
    summary = summarize_snapshot(load_snapshot(path), str(path))
    (device,) = summary.devices
    assert device.history_events == 1_000_000 and summary.memory[0].peak_bytes > 0
    assert len(summary.memory[0].timeline.t_ms) <= 240


@pytest.mark.slow
def test_the_guide_example_runs(tmp_path: Path) -> None:
    proc = run_doc_example("mem-oom-snapshot", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1,024.0 MiB short" in proc.stdout and "remedy: halve the micro-batch" in proc.stdout


REAL = sorted((Path(__file__).parent / "data").glob("cuda_*snapshot*.pickle.gz"))


@pytest.mark.skipif(not REAL, reason="no real GPU snapshot in tests/data yet: `make gpu-check` (its memory "
                    "section) writes them to <out>/tests_data/ for the next session with a GPU to commit")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_gpu_snapshots_in_tests_data(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = mem_json(capsys, path)
    (snap,) = doc["snapshots"]
    assert snap["devices"][0]["reserved_bytes"] >= snap["devices"][0]["allocated_bytes"] > 0
    assert snap["memory"] and snap["memory"][0]["peak_bytes"] > 0
    if "oom" in path.name:
        assert doc["oom"] is not None and doc["oom"]["requested_bytes"] > 0
