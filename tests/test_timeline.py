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

from torchprof_args.ondemand.window import OnDemandWindow
from torchprof_args.runtime.schedule import RECORDING, Action, ProfileSchedule
from torchprof_args.runtime.timeline import FENCE_FLUSH, FENCE_SNAPSHOT, StepPlan, Timeline

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
    code = ("import sys, torchprof_args.runtime.timeline, torchprof_args.runtime.schedule; "
            "sys.exit('torch' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env(), timeout=60)
