"""One clock per host where few collectives are shared (issue 36, item 1's fallback): the ends of the
steps bounded by a collective every rank waits in, and ``torchprof hang``'s flight-recorder records.

Real gloo jobs, their traces and dumps rewritten as if rank 1 ran on a host whose clock is off
(``tests/helpers/hosts.py``; the dumps' times moved here), each answer compared with the unshifted one
within the uncertainty the alignment states.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from helpers.hosts import simulate_hosts, straggler_job
from helpers.paths import DATA, JOBS
from helpers.processes import run_torchrun

from torchprof_args.analysis.analyzers.clocks import align_clocks
from torchprof_args.analysis.collect.pool import collect
from torchprof_args.analysis.collect.trace_results import DIAGNOSIS
from torchprof_args.console import main as torchprof

OFFSETS_US = [100.0, -100.0, 12_000.0, -12_000.0, 100_000.0, -100_000.0]

def run_json(capsys: pytest.CaptureFixture[str], *args: str, progress: bool = True) -> dict:
    capsys.readouterr()
    quiet = ["--no-progress"] if progress else []  # hang draws no progress bar
    assert torchprof([*args, "--json", *quiet]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory) -> list[Path]:
    """A real 2-rank gloo DDP job, rank 1 30 ms slower before each gradient all-reduce, 2 steps traced:
    one all-reduce each, fewer than the 3 shared collectives the primary estimate needs."""
    return straggler_job(tmp_path_factory.mktemp("two_steps"), iters=6, active=2)


@pytest.mark.slow
def test_few_collectives_fall_back_to_step_boundaries(tmp_path, capsys, two_steps):
    """Rank 1 on a host whose clock is off by 0.1 to 100 ms, either way: its offset is found from the two
    all-reduces and the two step ends after them, within the stated uncertainty, and collectives and
    diagnose name the straggler as on one clock."""
    one = str(two_steps[0].parent)
    base_coll = run_json(capsys, "collectives", one)
    base_diag = run_json(capsys, "diagnose", one)
    assert base_coll["clock"]["reason"] == "one host: one clock" and base_coll["clock"]["basis"] is None
    straggler = next(f for f in base_diag["findings"] if f["kind"] == "straggler")
    assert straggler["ranks"] == [1] and base_coll["ranks_by_wait_caused"][0]["rank"] == 1
    stated = {}
    for offset in OFFSETS_US:
        moved = simulate_hosts(two_steps, tmp_path / f"shift{offset:+.0f}", {1: ("hostb", offset)})
        cycle = str(moved[0].parent)
        coll = run_json(capsys, "collectives", cycle)
        clock = coll["clock"]
        host = clock["hosts"][1]
        stated[offset] = host["uncertainty_us"]
        assert clock["aligned"] and clock["basis"] == "step boundaries", clock
        assert (clock["collectives"], clock["boundaries"], host["collectives"]) == (2, 2, 4), clock
        assert abs(host["offset_us"] + offset) <= host["uncertainty_us"], (offset, host)
        assert coll["ranks_by_wait_caused"][0]["rank"] == 1, coll["ranks_by_wait_caused"]
        diag = run_json(capsys, "diagnose", cycle)
        assert diag["clock"]["basis"] == "step boundaries"
        found = next(f for f in diag["findings"] if f["kind"] == "straggler")
        assert found["ranks"] == [1]
        tolerance_ms = host["uncertainty_us"] / 1e3
        assert abs(found["ms_per_step"] - straggler["ms_per_step"]) <= tolerance_ms + 1.0, (found, straggler)
    # what is stated does not depend on how far off the clock is (which rank arrived last is read on
    # the aligned clocks, the transfer time without comparing clocks)
    assert max(stated.values()) <= 1.1 * min(stated.values()), stated
    capsys.readouterr()
    assert torchprof(["collectives", cycle, "--no-progress"]) == 0
    assert "2 hosts aligned on 2 collectives and 2 step ends after one (too few collectives)" in \
        capsys.readouterr().out


@pytest.mark.slow
def test_too_few_readings_say_why_in_one_line(tmp_path, two_steps):
    """The same real ranks with the second step's all-reduce left out: one collective and one bounded
    step end (the second step has no collective), too few: estimated, not applied, and said."""
    moved = simulate_hosts(two_steps, tmp_path / "moved", {1: ("hostb", 5_000.0)})
    ranks = [r.diagnosis.comms(i) for i, r in enumerate(collect(moved, parts=(DIAGNOSIS,)).results)]
    first = ranks[0].steps[0]["name"]
    for rc in ranks:
        rc.records = [r for r in rc.records if r.step == first]
    clock = align_clocks(ranks)
    assert not clock.aligned and clock.basis == "step boundaries"
    assert clock.reason == ("host hostb shares fewer than 3 collectives and step ends after one every rank "
                            "waits in with the others")
    assert clock.hosts[1].collectives == 2
    assert "\n" not in (clock.line() or "")


def test_enough_collectives_keep_the_primary_estimate(tmp_path, capsys):
    """Real NCCL traces with 4 shared collectives: the collectives alone (the basis says so), no step
    boundary read."""
    cycle = tmp_path / "iter000001-000003"
    cycle.mkdir()
    traces = [Path(shutil.copy(DATA / f"gpu_128rank_sampled_rank{r}.json.gz", cycle)) for r in (0, 1)]
    moved = simulate_hosts(traces, tmp_path / "two_hosts", {1: ("hostb", 30_000.0)})
    clock = run_json(capsys, "collectives", str(moved[0].parent))["clock"]
    assert clock["aligned"]
    assert (clock["basis"], clock["collectives"], clock["boundaries"]) == ("collectives", 4, 0)


@pytest.fixture(scope="module")
def hang_dumps(tmp_path_factory) -> Path:
    """A real 2-rank gloo hang, the hang guide's (rank 1 skips iteration 3's all-reduce and goes into the
    flush barrier; gloo's 5 s timeout): both ranks' flight-recorder dumps and dump_info."""
    tmp = tmp_path_factory.mktemp("hang")
    run_torchrun(JOBS / "comm_job.py", "--result-dir", str(tmp), "--iters", "5", "--skip-rank", "1",
                 "--skip-iteration", "3", "--pg-timeout", "5", "--torch-profile", "--torch-profile-ranks",
                 "all", "--torch-profile-skip-first", "0", "--torch-profile-active", "2",
                 "--torch-profile-dir", str(tmp / "prof"), "--torch-profile-flight-recorder", "64",
                 cwd=tmp)  # meant to fail
    dumps = tmp / "prof" / "flight_recorder"
    assert sorted(p.name for p in dumps.glob("gloo_trace_rank_*")) == [f"gloo_trace_rank_{r}" for r in (0, 1)]
    return dumps


def _moved_dumps(src: Path, out: Path, offset_us: float) -> Path:
    """``src``'s dumps as if rank 1 ran on host ``hostb``, whose wall clock is ``offset_us`` ahead."""
    shutil.copytree(src, out)
    dump = pickle.loads((out / "gloo_trace_rank_1").read_bytes())
    for entry in dump["entries"]:
        for key in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
            if entry.get(key) is not None:
                entry[key] += round(offset_us * 1e3)
    (out / "gloo_trace_rank_1").write_bytes(pickle.dumps(dump))
    info = json.loads((out / "dump_info_rank1.json").read_text())
    (out / "dump_info_rank1.json").write_text(json.dumps({**info, "host": "hostb"}))
    return out


@pytest.mark.slow
def test_hang_puts_the_flight_recorders_hosts_on_one_clock(tmp_path, capsys, hang_dumps):
    """Rank 1's dump written on a host whose clock is off by 0.1 to 100 ms: hang aligns it at the
    records both ranks completed (gloo: the next record's creation), and when each rank issued its last
    collective, the finding and the rank that went quiet first are those of one clock."""
    base = run_json(capsys, "hang", str(hang_dumps), progress=False)["recorders"][0]
    assert base["clock"]["reason"] == "one host: one clock"
    quiet_first = min(base["last_issued_s"], key=base["last_issued_s"].get)
    for offset in OFFSETS_US:
        moved = _moved_dumps(hang_dumps, tmp_path / f"shift{offset:+.0f}", offset)
        found = run_json(capsys, "hang", str(moved), progress=False)["recorders"][0]
        clock = found["clock"]
        host = clock["hosts"][1]
        assert clock["aligned"] and clock["basis"] == "flight recorder" and host["collectives"] >= 3, clock
        assert abs(host["offset_us"] + offset) <= host["uncertainty_us"], (offset, host)
        assert found["findings"] == base["findings"]
        for rank, seconds in base["last_issued_s"].items():
            assert abs(found["last_issued_s"][rank] - seconds) * 1e6 <= host["uncertainty_us"] + 1.0
        if abs(base["last_issued_s"]["1"] - base["last_issued_s"]["0"]) * 1e6 > 2 * host["uncertainty_us"]:
            assert min(found["last_issued_s"], key=found["last_issued_s"].get) == quiet_first
    assert torchprof(["hang", str(moved), "--brief"]) == 0
    text = capsys.readouterr().out
    assert f"clock: 2 hosts aligned on {clock['collectives']} flight-recorder collectives; host hostb" in text
    assert "When each rank issued its last collective" in text
