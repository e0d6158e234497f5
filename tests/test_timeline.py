"""``Timeline.plan``: what every step does, across schedules, on-demand windows, a window cut short
by the low-memory vote, the last iteration, memory snapshots and nsys ranges.  Without torch."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from collections.abc import Callable, Iterable

import pytest
from helpers.processes import subprocess_env

from torchprof_args.capture.ondemand.window import OnDemandWindow
from torchprof_args.capture.runtime.export.progress import ROW_FIELDS
from torchprof_args.capture.runtime.fence import Fence
from torchprof_args.capture.runtime.publish_vote import PublishingVote
from torchprof_args.capture.runtime.schedule import RECORDING, Action, ProfileSchedule
from torchprof_args.capture.runtime.timeline import FENCE_FLUSH, FENCE_SNAPSHOT, StepPlan, Timeline

NONE, WARMUP, RECORD, SAVE = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE


def timeline(schedule: ProfileSchedule | None = None, *, scheduled: bool = True, rank: int = 0,
             record: bool = True, first: int = 1) -> Timeline:
    return Timeline(schedule or ProfileSchedule(), scheduled=scheduled, first_iteration=first, rank=rank,
                    record=record)


def walk(line: Timeline, iterations: Iterable[int],
         agree: Callable[[int], None] | None = None) -> dict[int, StepPlan]:
    """The plans of the steps the profiler's hot path does not skip, executed as the profiler does:
    ``agree(i)`` stands for the step's collective decisions (on-demand check, low-memory vote)."""
    plans: dict[int, StepPlan] = {}
    next_busy: float = -math.inf  # the first step is busy (it anchors the numbering)
    for iteration in iterations:
        if iteration < next_busy:
            continue
        if not line.anchored:
            line.anchor(iteration)
        if agree is not None:
            agree(iteration)
        plan = plans[iteration] = line.plan(iteration)
        if plan.window_ends:
            line.window = None
        next_busy = plan.next_busy
    return plans


def transitions(plans: dict[int, StepPlan]) -> dict[int, tuple[Action, Action, str | None]]:
    return {i: (p.record, p.record_next, p.fence) for i, p in plans.items()}


def test_cycles_wait_warmup_active_repeat():
    # skip 1, then twice: wait 3 (2-4), warmup 1 (5), record 2 (6-7); again 8-10, 11, 12-13.
    line = timeline(ProfileSchedule(wait=3, warmup=1, active=2, repeat=2, skip_first=1))
    plans = walk(line, range(1, 40))
    assert transitions(plans) == {
        1: (NONE, NONE, None), 4: (NONE, WARMUP, None), 5: (WARMUP, RECORD, None),
        6: (RECORD, SAVE, None), 7: (SAVE, NONE, FENCE_FLUSH),
        10: (NONE, WARMUP, None), 11: (WARMUP, RECORD, None),
        12: (RECORD, SAVE, None), 13: (SAVE, NONE, FENCE_FLUSH),
    }
    assert [i for i, p in plans.items() if p.cycle_snapshot] == [7, 13]
    assert plans[13].next_busy == math.inf  # the last cycle: nothing planned after it
    # nsys_recording: the step before each recorded one
    assert [i for i, p in plans.items() if p.nsys_recording] == [5, 6, 11, 12]
    assert not any(p.window_ends for p in plans.values())


def test_untraced_rank_fences_at_the_same_steps_without_recording():
    schedule = ProfileSchedule(wait=3, warmup=1, active=2, repeat=2, skip_first=1)
    traced, untraced = (walk(timeline(schedule), range(1, 40)),
                        walk(timeline(schedule, record=False), range(1, 40)))
    assert traced.keys() == untraced.keys()
    assert [(p.action, p.fence, p.next_busy) for p in traced.values()] == [
        (p.action, p.fence, p.next_busy) for p in untraced.values()]
    assert all(p.record is NONE and p.record_next is NONE for p in untraced.values())


COMBOS = list(itertools.product([0, 1, 3], [0, 1, 2], [1, 3], [0, 1, 2], [0, 1, 3]))


@pytest.mark.parametrize(("wait", "warmup", "active", "repeat", "skip_first"), COMBOS)
def test_skipped_steps_have_nothing_to_do(wait, warmup, active, repeat, skip_first):
    schedule = ProfileSchedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    horizon = range(1, 60)
    plans = walk(timeline(schedule), horizon)
    for iteration in horizon:
        expected = (schedule.action(iteration), schedule.action(iteration + 1))
        if iteration in plans:
            plan = plans[iteration]
            assert (plan.record, plan.record_next) == expected, iteration
            assert plan.fence == (FENCE_FLUSH if expected[0] is SAVE else None)
        else:
            assert expected == (NONE, NONE), iteration


def test_absolute_window_ends_the_plan_after_its_flush():
    plans = walk(timeline(ProfileSchedule(warmup=2, step_start=10, step_end=13)), range(1, 30))
    assert transitions(plans) == {
        1: (NONE, NONE, None), 7: (NONE, WARMUP, None), 8: (WARMUP, WARMUP, None), 9: (WARMUP, RECORD, None),
        10: (RECORD, RECORD, None), 11: (RECORD, SAVE, None), 12: (SAVE, NONE, FENCE_FLUSH),
    }
    assert plans[12].next_busy == math.inf


def test_relative_schedule_follows_the_first_step_number():
    plans = walk(timeline(ProfileSchedule(warmup=1, active=1, skip_first=1), first=1), range(101, 120))
    assert transitions(plans) == {101: (NONE, WARMUP, None), 102: (WARMUP, SAVE, None),
                                  103: (SAVE, NONE, FENCE_FLUSH)}


def on_demand(line: Timeline,
              decisions: dict[int, tuple[OnDemandWindow | None, float]]) -> Callable[[int], None]:
    """The on-demand decisions every rank adopts at its checks (check -> window, next check), as the
    profiler's check does."""

    def agree(iteration: int) -> None:
        if iteration >= line.next_check:
            window, line.next_check = decisions[iteration]
            if window is not None:
                line.window = window

    return agree


@pytest.mark.parametrize(("rank", "traces"), [(1, True), (0, False)])
def test_on_demand_window_is_fenced_on_every_rank_and_recorded_on_its_ranks(rank, traces):
    line = timeline(scheduled=False, rank=rank, record=False)
    line.next_check = 10
    window = OnDemandWindow("req1", 10, warmup_start=11, start=12, end=15, ranks=(1,))
    plans = walk(line, range(1, 40), on_demand(line, {10: (window, 30), 30: (None, math.inf)}))
    on = (lambda action: action) if traces else (lambda action: NONE)
    assert transitions(plans) == {
        1: (NONE, NONE, None), 10: (NONE, on(WARMUP), None), 11: (on(WARMUP), on(RECORD), None),
        12: (on(RECORD), on(RECORD), None), 13: (on(RECORD), on(SAVE), None),
        14: (on(SAVE), NONE, FENCE_FLUSH), 30: (NONE, NONE, None),
    }
    assert plans[1].next_busy == 10  # nothing scheduled: the next check is the next busy step
    assert [i for i, p in plans.items() if p.window_ends] == [14] and line.window is None
    assert plans[14].next_busy == 30 and plans[30].next_busy == math.inf  # the window is forgotten
    assert not any(p.cycle_snapshot or p.nsys_recording for p in plans.values())  # scheduled cycles only


def test_on_demand_window_after_a_scheduled_cycle():
    line = timeline(ProfileSchedule(warmup=1, active=2, skip_first=0), rank=0)  # records 2-3
    line.next_check = 3
    window = OnDemandWindow("req2", 3, warmup_start=4, start=5, end=6, ranks=None)
    plans = walk(line, range(1, 20), on_demand(line, {3: (window, 100), 100: (None, math.inf)}))
    assert transitions(plans) == {
        1: (WARMUP, RECORD, None), 2: (RECORD, SAVE, None), 3: (SAVE, WARMUP, FENCE_FLUSH),
        4: (WARMUP, SAVE, None), 5: (SAVE, NONE, FENCE_FLUSH),
    }
    assert plans[3].cycle_snapshot and not plans[5].cycle_snapshot
    assert plans[5].window_ends and plans[5].next_busy == 100


def test_window_cut_short_by_the_low_memory_vote():
    # warmup 1 (1), record 2..5; the vote collected at 3 says a rank ran low: 3 is the window's last.
    line = timeline(ProfileSchedule(warmup=1, active=4, skip_first=0, repeat=2))
    plans = walk(line, range(1, 30), lambda i: i == 3 and line.cut_window(3))
    assert line.cut == (3, 5)
    assert transitions(plans) == {
        1: (WARMUP, RECORD, None), 2: (RECORD, RECORD, None), 3: (SAVE, NONE, FENCE_FLUSH),
        # the planned rest of the window does nothing; the next cycle (warmup 6, record 7-10) as planned
        4: (NONE, NONE, None), 5: (NONE, WARMUP, None), 6: (WARMUP, RECORD, None), 7: (RECORD, RECORD, None),
        8: (RECORD, RECORD, None), 9: (RECORD, SAVE, None), 10: (SAVE, NONE, FENCE_FLUSH),
    }
    assert plans[3].cycle_snapshot and plans[3].action is SAVE and plans[3].flush


def test_memory_snapshot_intervals_fence_every_rank_once():
    line = timeline(ProfileSchedule(warmup=1, step_start=7, step_end=9), record=False)  # flush at 8
    line.snapshot_interval = 4
    plans = walk(line, range(0, 17))
    assert {i: (p.fence, p.cycle_snapshot) for i, p in plans.items() if p.fence} == {
        4: (FENCE_SNAPSHOT, False), 8: (FENCE_FLUSH, True), 12: (FENCE_SNAPSHOT, False),
        16: (FENCE_SNAPSHOT, False)}
    assert plans[0].fence is None and plans[0].next_busy == 4
    assert plans[12].next_busy == 16


def test_nsys_needs_every_step_and_covers_the_scheduled_windows_only():
    schedule = ProfileSchedule(wait=1, warmup=1, active=2, repeat=1, skip_first=0)  # records 3-4
    line = timeline(schedule)
    line.every_step, line.next_check = True, 7
    window = OnDemandWindow("req3", 7, warmup_start=8, start=8, end=10, ranks=None)
    plans = walk(line, range(1, 14), on_demand(line, {7: (window, 50)}))
    assert list(plans) == list(range(1, 14))
    assert all(p.next_busy == p.iteration + 1 for p in plans.values())
    assert [i + 1 for i, p in plans.items() if p.nsys_recording] == [
        i for i in range(2, 15) if schedule.action(i) in RECORDING] == [3, 4]
    assert plans[9].fence == FENCE_FLUSH and plans[9].window_ends


def test_timeline_imports_without_torch():
    code = ("import sys, torchprof_args.capture.runtime.timeline, torchprof_args.capture.runtime.schedule; "
            "sys.exit('torch' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env(), timeout=60)


# -- the publishing vote (backpressure): runtime/publish_vote.py over a real single-process Fence ------

def publishing(line: Timeline, limit: int, in_flight: Callable[[int], int]) -> Callable[[int], None]:
    """``agree`` for :func:`walk`: the profiler's order (decide before the plan, post after it), with
    ``in_flight(i)`` publications on this rank after step ``i``."""
    vote = PublishingVote(limit, Fence(60.0, rank=0), rank=0)
    line.vote_ahead = True

    def agree(iteration: int) -> None:
        vote.decide(iteration, line)
        vote.post(iteration, line, lambda: [in_flight(iteration)] + [0] * (len(ROW_FIELDS) - 1))
    return agree


def test_the_vote_is_posted_two_steps_before_each_window_and_idle_steps_stay_idle():
    line = timeline(ProfileSchedule(wait=3, warmup=1, active=2, repeat=2, skip_first=1))
    plans = walk(line, range(1, 40), publishing(line, 2, lambda i: 0))
    # windows begin (warmup) at 5 and 11: the steps before them (3, 9) are busy now, nothing else more
    assert list(plans) == [1, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13]
    assert line.skipped is None and [i for i, p in plans.items() if p.flush] == [7, 13]


def test_a_window_is_skipped_while_publishing_is_behind_and_the_next_one_records():
    # windows record 6-7 and 12-13 (flush 7, 13), 18-19 (flush 19); 2 publications in flight from
    # iteration 7 to 14: the window beginning at 11 is skipped, the one at 17 (voted at 15) records.
    line = timeline(ProfileSchedule(wait=3, warmup=1, active=2, repeat=3, skip_first=1))
    plans = walk(line, range(1, 40), publishing(line, 2, lambda i: 2 if 7 <= i <= 14 else 0))
    assert line.skipped == (11, 13)
    assert [i for i, p in plans.items() if p.flush] == [7, 19]
    assert not any(p.record is not NONE or p.fence for i, p in plans.items() if 10 <= i <= 16)
    assert transitions(plans)[16] == (NONE, WARMUP, None)


def test_back_to_back_windows_count_the_flush_still_due():
    # no wait, no warmup, one step per window: a window begins right after each flush.  One
    # publication in flight + the flush at the step before the window = 2: skipped at limit 2.
    line = timeline(ProfileSchedule(wait=0, warmup=0, active=1, repeat=4, skip_first=1))
    plans = walk(line, range(1, 20), publishing(line, 2, lambda i: 1 if i == 2 else 0))
    assert [i for i, p in plans.items() if p.flush] == [2, 3, 5]  # 4 skipped
    line = timeline(ProfileSchedule(wait=0, warmup=0, active=1, repeat=4, skip_first=1))
    assert [i for i, p in walk(line, range(1, 20), publishing(line, 0, lambda i: 9)).items()
            if p.flush] == [2, 3, 4, 5]  # --torch-profile-max-publishing 0: no bound


def test_rank_0_reports_each_cycle_in_one_line(logs):
    vote = PublishingVote(2, Fence(60.0, rank=0), rank=0)
    # rows: in_flight, published, kbytes, failed, slowest_ms, cycle_first, cycle_last, summary_failed
    vote.report([[0, 1, 1500, 0, 800, 4, 5, 0], [1, 1, 1300, 0, 2300, 4, 5, 0], [0, 0, 0, 1, 0, 0, 0, 0]])
    vote.report([[0, 2, 3000, 0, 700, 8, 9, 0], [0, 2, 2600, 0, 900, 8, 9, 0], [0, 0, 0, 1, 0, 0, 0, 0]])
    vote.report([[0, 2, 3000, 0, 0, 8, 9, 0], [0, 2, 2600, 0, 0, 8, 9, 0], [0, 0, 0, 1, 0, 0, 0, 0]])  # same
    vote.report([[0, 3, 4500, 0, 600, 10, 11, 1], [0, 3, 3900, 0, 500, 10, 11, 0], [0, 0, 0, 1, 0, 0, 0, 0]])
    assert [(r.levelname, r.getMessage().split("] ", 1)[1]) for r in logs.records] == [
        ("WARNING", "rank 0: 2 trace(s) published up to iter000004-000005 (2.8 MB), slowest publisher rank 1 "
                    "(2.3 s), 1 failed (rank(s) 2: see their errors); 1 in flight"),
        ("INFO", "rank 0: 2 trace(s) published up to iter000008-000009 (2.8 MB), slowest publisher rank 1 "
                 "(0.9 s), none failed"),
        ("WARNING", "rank 0: 2 trace(s) published up to iter000010-000011 (2.8 MB), slowest publisher rank 0 "
                    "(0.6 s), none failed; 1 published without their summary sidecar (rank(s) 0: see their "
                    "warnings; the tools parse those traces)")]
    quiet = PublishingVote(2, Fence(60.0, rank=1), rank=1)
    quiet.report([[0, 1, 1500, 0, 800, 4, 5, 0], [1, 1, 1300, 1, 2300, 4, 5, 0]])
    assert len(logs.records) == 3  # other ranks never log the cycle line


def test_rank_0_warns_once_per_streak_of_skipped_windows(logs):
    # a window every 2 steps (flush at 3, 5, 7, ...); behind from 3 to 9: windows 5, 7, 9 skipped
    line = timeline(ProfileSchedule(wait=1, warmup=0, active=1, repeat=8, skip_first=1))
    plans = walk(line, range(1, 20), publishing(line, 1, lambda i: 1 if 3 <= i <= 8 else 0))
    assert [i for i, p in plans.items() if p.flush] == [3, 11, 13, 15, 17]
    messages = [(r.levelname, r.getMessage().split("] ", 1)[1]) for r in logs.records if r.levelno >= 20]
    assert messages == [
        ("WARNING", "rank 0: publishing is behind: rank 0 has 1 trace(s) in flight (--torch-profile-max-"
                    "publishing 1); skipping the window of iterations 5..5 on every rank (1 skipped so far)"),
        ("INFO", "rank 0: publishing caught up; the window beginning at iteration 11 records (3 window(s) "
                 "skipped in a row, 3 in all)")]
