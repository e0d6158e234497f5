"""A generated CPU trace dense in collectives: the shape that exposes a search over all events per
collective (the scaling tests, issue 34).

One gloo rank's window: per step, ``per_step`` blocks on the step's thread, each an ``aten::mm``, then a
``c10d::allreduce_`` issued at the step's top level whose ``gloo:all_reduce`` runs on gloo's worker
thread while the step's thread waits (records nothing), then resumes.  Everything a real trace of
``tests/jobs/cpu_heavy_job.py`` has where these analyses look, ``per_step`` times as dense.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PID, MAIN, GLOO = 100, 1, 2
#: one block's length (us): mm 20, issue 5, gloo's run 24 from 1 us after the issue, resume 2 us later.
BLOCK_US = 52.0


def write_collective_trace(path: Path, steps: int, per_step: int = 50) -> Path:
    """Write the trace of ``steps`` steps of ``per_step`` blocks each to ``path`` (plain JSON)."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": GLOO, "args": {"name": "gloo"}},
    ]
    t, ext = 1000.0, 1
    for step in range(steps):
        begin = t
        for _ in range(per_step):
            events += [
                _op("aten::mm", MAIN, t + 1, 20, ext, "cpu_op"),
                _op("c10d::allreduce_", MAIN, t + 21, 5, ext + 1, "cpu_op"),
                _op("gloo:all_reduce", GLOO, t + 27, 24, ext + 2, "user_annotation"),
            ]
            t, ext = t + BLOCK_US + 1, ext + 3
        events.append(_op(f"ProfilerStep#{step + 1}", MAIN, begin, t - begin, ext, "user_annotation"))
        t, ext = t + 10, ext + 1
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
           "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    path.write_text(json.dumps(doc))
    return path


def _op(name: str, tid: int, ts: float, dur: float, ext: int, cat: str) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": round(ts, 3), "dur": dur,
            "args": {"External id": ext}}
