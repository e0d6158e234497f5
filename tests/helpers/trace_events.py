"""Reading a published trace in the framework tests: its events, its ``ProfilerStep#N`` numbers, how
many events of a kind fall inside each step."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as handle:
        return json.load(handle)


def profiler_steps(path: Path) -> list[int]:
    """The trace's ``ProfilerStep#N`` numbers, sorted."""
    return sorted({int(e["name"].split("#")[1]) for e in load_trace(path)["traceEvents"]
                   if e.get("name", "").startswith("ProfilerStep#")})


def count_per_step(events: list[dict[str, Any]], matches: Callable[[str], bool]) -> dict[int, int]:
    """Complete events whose name ``matches``, per ``ProfilerStep#N`` they start in."""
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X"]
    counts = {int(step["name"].split("#")[1]): 0 for step in steps}
    for event in events:
        if event.get("ph") == "X" and matches(event.get("name", "")):
            for step in steps:
                if step["ts"] <= event["ts"] <= step["ts"] + step["dur"]:
                    counts[int(step["name"].split("#")[1])] += 1
    return counts
