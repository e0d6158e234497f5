"""An accepted on-demand window that the publishing vote skips: its requester is told why."""

from __future__ import annotations

import json
import threading
import time

from torchprof_args.capture.ondemand.config import OnDemandConfig
from torchprof_args.capture.ondemand.controller import OnDemandController
from torchprof_args.capture.ondemand.window import OnDemandWindow
from torchprof_args.capture.runtime.export.progress import ROW_FIELDS
from torchprof_args.capture.runtime.fence import Fence
from torchprof_args.capture.runtime.publish_vote import PublishingVote
from torchprof_args.capture.runtime.schedule import ProfileSchedule
from torchprof_args.capture.runtime.timeline import Timeline
from torchprof_args.commands.trigger import wait_for_traces

BEHIND = "publishing is behind: rank 0 has 2 trace(s) in flight (--torch-profile-max-publishing 2)"


def test_the_vote_skips_an_on_demand_window_and_says_why():
    # no schedule; an on-demand window warms up at 11 and records 12-13; 2 publications in flight
    line = Timeline(ProfileSchedule(), scheduled=False, first_iteration=1, rank=0, record=True)
    line.anchor(1)
    line.vote_ahead = True
    line.window = OnDemandWindow("req1", 10, warmup_start=11, start=12, end=14, ranks=None)
    vote = PublishingVote(2, Fence(60.0, rank=0), rank=0)
    vote.post(9, line, lambda: [2] + [0] * (len(ROW_FIELDS) - 1))
    reason = vote.decide(10, line)
    assert reason == BEHIND
    assert line.skipped == (11, 13) and line.window.warmup_start <= 11 < line.window.end
    assert not any(line.plan(i).flush for i in range(10, 15))


def test_a_skipped_window_is_answered_and_trigger_stops_waiting(tmp_path, logs):
    config = OnDemandConfig(enabled=True, control_dir=str(tmp_path / "control"), trace_dir=str(tmp_path))
    controller = OnDemandController(config, rank=0, world_size=1)
    inbox = controller._inbox
    inbox.prepare()
    window = OnDemandWindow("req1", 10, warmup_start=11, start=12, end=14, ranks=None)
    never = str(tmp_path / "iter000012-000013" / "rank00000.pt.trace.json.gz")
    inbox.answer("req1", {"status": "accepted", "traces": {"0": never}})
    answer_path = tmp_path / "control" / "answers" / "req1.json"
    skip = threading.Timer(0.3, controller.window_skipped, (window, BEHIND))
    started = time.monotonic()
    skip.start()
    missing = wait_for_traces([never], time.monotonic() + 60, quiet=True, answer_path=answer_path)
    assert missing == [never] and time.monotonic() - started < 10  # not the 60 s deadline
    answer = json.loads(answer_path.read_text())
    assert answer["status"] == "skipped" and answer["reason"].endswith("; ask again later")
    assert answer["window"] == {"warmup_start": 11, "start": 12, "end": 14, "last": 13}
    assert any(r.levelname == "WARNING" and "on-demand request req1 skipped: publishing is behind"
               in r.getMessage() for r in logs.records)
