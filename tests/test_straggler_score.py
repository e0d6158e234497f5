""""Straggler" means one thing everywhere (torchprof_args/shared/stragglers.py): a rank's score is its
figure over the median of the *other* ranks', and it is a straggler from 1.05x and 2 ms over that
median.  The step timers (scores, warning), ``summary``'s cross-rank view and ``diagnose``'s
``straggler`` give the same scores and the same verdict on the same ranks' figures, here the work
per step of a real pair of ranks with a straggler injected (tests/data's gloo DDP pair)."""

from __future__ import annotations

import statistics
from pathlib import Path

import msgspec
import pytest
from helpers.diagnose_traces import CPU_PAIR, straggler_pair

from torchprof_args.analysis import Summary, cross_rank, load_trace, summarize
from torchprof_args.analysis.diagnose.context import KindContext
from torchprof_args.analysis.diagnose.cycle import CycleRanks
from torchprof_args.analysis.diagnose.finding import Finding
from torchprof_args.analysis.diagnose.kinds import straggler
from torchprof_args.analysis.diagnose.rank import rank_diagnosis
from torchprof_args.analysis.render.text import format_cross_rank
from torchprof_args.capture.metrics.config import STRAGGLER_THRESHOLD as THRESHOLD_FLAG
from torchprof_args.capture.metrics.config import TimersConfig
from torchprof_args.capture.metrics.straggler_tracker import StragglerTracker, straggler_figures
from torchprof_args.shared.stragglers import (
    STRAGGLER_MIN_MS,
    STRAGGLER_THRESHOLD,
    is_straggler,
    others_medians,
    straggler_score,
)


def test_the_score_is_over_the_median_of_the_other_ranks() -> None:
    for values in ([4.0, 1.0], [1.0, 2.0, 9.0], [3.0, 3.0, 1.0, 8.0, 2.0], [5.0, 1.0, 1.0, 2.0, 7.0, 7.0]):
        assert others_medians(values) == [statistics.median(values[:i] + values[i + 1:])
                                          for i in range(len(values))]
    # two ranks: each against the other (the median of both would hide half the excess: 1.6x)
    assert [straggler_score(v, m) for v, m in zip([1.0, 4.0], others_medians([1.0, 4.0]), strict=True)] == \
        [0.25, 4.0]
    assert straggler_score(1.0, 0.0) is None
    # both conditions: the ratio and the 2 ms
    assert is_straggler(105.0, 100.0) and not is_straggler(104.9, 100.0)
    assert is_straggler(12.0, 10.0) and not is_straggler(11.9, 10.0)  # 1.19x, 1.9 ms
    assert (STRAGGLER_THRESHOLD, STRAGGLER_MIN_MS) == (1.05, 2.0)


def test_every_consumer_uses_the_one_threshold() -> None:
    assert THRESHOLD_FLAG.default == TimersConfig().straggler_threshold == STRAGGLER_THRESHOLD
    assert straggler.THRESHOLD.min_ms == STRAGGLER_MIN_MS and straggler.THRESHOLD.share_of_step == 0.0


def _pair(tmp_path: Path, x_us: float) -> tuple[list[Summary], dict[int, float], Finding | None]:
    """The pair with ``x_us`` more work per step on rank 1: its summaries, each rank's work per step
    (ms, diagnose's figure) and ``diagnose``'s ``straggler`` finding."""
    traces = [load_trace(p, comms=True, flops=True) for p in straggler_pair(tmp_path, x_us, pair=CPU_PAIR)]
    ranks = CycleRanks([rank_diagnosis(t) for t in traces])
    every = straggler.analyze(ranks, KindContext(thresholds_off=True))
    assert isinstance(every, Finding)
    work = {int(r): ms for r, ms in every.evidence["work_ms_per_step"].items()}
    found = straggler.analyze(ranks)
    assert found is None or isinstance(found, Finding)
    return [summarize(t) for t in traces], work, found


@pytest.mark.parametrize(("x_us", "expected"), [(0, ()), (1e3, ()), (3e3, (1,)), (100e3, (1,))])
def test_timers_summary_and_diagnose_agree_on_the_same_figures(tmp_path: Path, x_us: float,
                                                               expected: tuple[int, ...]) -> None:
    """Rank 1 with 0, 1, 3 and 100 ms more work per step (about 5 ms each without): 1 ms makes it
    1.2x the other rank, but under 2 ms; 3 ms is a straggler."""
    summaries, work, found = _pair(tmp_path, x_us)
    assert (found.ranks if found is not None else ()) == expected
    # the step timers: the work as a timer's reading (seconds) on each rank
    times = [[work[0] / 1e3], [work[1] / 1e3]]
    _, per_rank = straggler_figures(["work"], times, [0, 1], ["work"])
    warnings = StragglerTracker(STRAGGLER_THRESHOLD, 1, rank=1).update(1, ["work"], times, per_rank, [0, 1])
    warned = tuple(int(w.split()[2]) for w in warnings)  # "straggler: rank N ..."
    # summary's view: the same ranks with diagnose's work as theirs
    view = cross_rank([msgspec.structs.replace(s, work_mean_us=work[s.rank] * 1e3) for s in summaries])
    assert warned == tuple(r.rank for r in view.stragglers) == expected
    scores = [work[0] / work[1], work[1] / work[0]]
    assert per_rank["stragglers/work-score"] == pytest.approx(scores)
    assert [r.straggler_score for r in view.ranks] == pytest.approx(scores)
    if found is not None:
        assert found.evidence["straggler_score"] == {"1": pytest.approx(scores[1], abs=1e-3)}


def test_summary_names_the_rank_the_others_wait_for_not_the_waiting_one(tmp_path: Path) -> None:
    """Both ranks' steps are as long (rank 0 waits for rank 1 in the collectives): scored by step
    time no rank stands out; summary scores each rank's work (its step less its own time in
    collectives) and names rank 1, as diagnose does."""
    summaries, work, found = _pair(tmp_path, 100e3)
    view = cross_rank(summaries)
    assert found is not None and found.ranks == (1,) and work[1] > 10 * work[0]
    steps = [s.step_mean_us or 0.0 for s in summaries]
    assert abs(steps[1] - steps[0]) < 0.05 * max(steps)  # the step times alone name nobody
    assert [r.rank for r in view.stragglers] == [1] and view.slowest_rank == 1 and view.fastest_rank == 0
    assert all(s.work_mean_us is not None and s.work_mean_us <= (s.step_mean_us or 0.0) for s in summaries)
    text = format_cross_rank(view)
    assert ("stragglers (work (the mean step less the time in collectives) >= 1.05x the other ranks' median "
            "and 2 ms over it): 1, rank(s) 1") in text
