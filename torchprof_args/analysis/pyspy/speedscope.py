"""py-spy raw profiles as one speedscope file (https://www.speedscope.app/file-format-schema.json).

speedscope (www.speedscope.app, which keeps the file in the browser, or offline: its release zip
or ``npm install -g speedscope``) draws the flamegraph: zoom, search, and a sandwich view of one
function's callers and callees across every rank.  We write the file from the parsed raw
stacks rather than ask ``py-spy record -f speedscope`` because py-spy writes one format per run
and the report needs ``raw``; the parsed stacks also merge several nodes' files and drop the
``torchprof pyspy record`` launcher's frames.
"""

from __future__ import annotations

from typing import Any

from torchprof_args.analysis.pyspy.parse import NATIVE, PYTHON, Frame, Profile
from torchprof_args.atomic import write_json_atomically

__all__ = ["SCHEMA", "speedscope_document", "write_speedscope"]

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def _frame(frame: Frame) -> dict[str, Any]:
    """A shared frame: the name as the report shows it (so searching a file name finds your code),
    plus the file and line speedscope shows on hover."""
    entry: dict[str, Any] = {"name": frame.label()}
    if frame.kind in (PYTHON, NATIVE) and frame.path is not None:
        entry["file"] = frame.path
        if frame.line is not None:
            entry["line"] = frame.line
    return entry


def speedscope_document(profile: Profile, name: str) -> dict[str, Any]:
    """One sampled profile of every stack (root first), weighted by its sample count."""
    index: dict[Frame, int] = {}
    samples = [[index.setdefault(frame, len(index)) for frame in stack.frames] for stack in profile.stacks]
    weights = [stack.count for stack in profile.stacks]
    return {
        "$schema": SCHEMA,
        "name": name,
        "exporter": "torchprof pyspy speedscope",
        "activeProfileIndex": 0,
        "shared": {"frames": [_frame(frame) for frame in index]},
        "profiles": [{"type": "sampled", "name": name, "unit": "none", "startValue": 0,
                      "endValue": sum(weights), "samples": samples, "weights": weights}],
    }


def write_speedscope(profile: Profile, output: str, name: str) -> None:
    """Write :func:`speedscope_document` to ``output`` atomically."""
    write_json_atomically(output, speedscope_document(profile, name), separators=(",", ":"))
