"""The schedule every rank evaluates: agrees with torch.profiler.schedule, absolute windows, skipping."""

from __future__ import annotations

import itertools

import pytest
import torch

from torchprof_args.capture.runtime.schedule import Action, ProfileSchedule

COMBOS = list(itertools.product([0, 1, 2], [0, 1, 2], [1, 3], [0, 1, 2], [0, 1, 3]))


@pytest.mark.parametrize(("wait", "warmup", "active", "repeat", "skip_first"), COMBOS)
def test_relative_mode_matches_torch_profiler_schedule(wait, warmup, active, repeat, skip_first):
    torch_schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat,
                                             skip_first=skip_first)
    ours = ProfileSchedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    first = 101  # resumed run: numbering continues from the checkpoint, the schedule counts this run
    for step in range(60):
        assert ours.action(first + step, first).name == torch_schedule(step).name, step


def brute_force_next_busy(schedule: ProfileSchedule, after: int, first: int,
                          horizon: int = 400) -> int | None:
    for iteration in range(after + 1, after + horizon):
        if schedule.action(iteration, first) is not Action.NONE:
            return iteration
    return None


@pytest.mark.slow
@pytest.mark.parametrize(("wait", "warmup", "active", "repeat", "skip_first"), COMBOS)
def test_next_busy_iteration_matches_brute_force(wait, warmup, active, repeat, skip_first):
    schedule = ProfileSchedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    for after in range(0, 40):
        assert schedule.next_busy_iteration(after, 1) == brute_force_next_busy(schedule, after, 1), after


def test_absolute_window_is_resume_safe():
    schedule = ProfileSchedule(warmup=2, step_start=1000, step_end=1003)
    actions = {i: schedule.action(i, first_iteration=900) for i in range(996, 1005)}
    assert [actions[i] for i in (997, 998, 999)] == [Action.NONE, Action.WARMUP, Action.WARMUP]
    assert [actions[i] for i in (1000, 1001, 1002)] == [Action.RECORD, Action.RECORD, Action.RECORD_AND_SAVE]
    assert actions[1003] is Action.NONE
    # The same answer whatever the run's first iteration was.
    assert all(schedule.action(i, 1) == actions[i] for i in actions)
    assert schedule.next_busy_iteration(0, 1) == 998
    assert schedule.next_busy_iteration(1002, 1) is None
    assert schedule.recorded_range(1002, 1) == (1000, 1002)


def test_from_args_step_start_without_end_uses_active():
    import argparse

    from torchprof_args import configs_from_args

    args = argparse.Namespace(torch_profile_step_start=50, torch_profile_step_end=None,
                              torch_profile_active=3, torch_profile_wait=0, torch_profile_warmup=1,
                              torch_profile_repeat=1, torch_profile_skip_first=1)
    schedule = configs_from_args(args, world_size=1).profiler.trace.schedule
    assert (schedule.step_start, schedule.step_end, schedule.active) == (50, 53, 3)
    assert "record iterations 50..52" in schedule.describe()


def test_invalid_schedules_are_rejected():
    with pytest.raises(ValueError):
        ProfileSchedule(active=0)
    with pytest.raises(ValueError):
        ProfileSchedule(step_start=5, step_end=5)
    with pytest.raises(ValueError, match="step_end needs step_start"):
        ProfileSchedule(step_end=5)


def test_a_start_without_an_end_records_active_iterations_as_the_flags_do():
    schedule = ProfileSchedule(warmup=1, active=2, step_start=10)
    assert schedule.window == (10, 12) and ProfileSchedule().window is None
    assert [schedule.action(i).name for i in (8, 9, 10, 11, 12)] == [
        "NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE", "NONE"]
