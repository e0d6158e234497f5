"""Inject a known problem into a copy of a real trace, for the diagnose tests.

The real trace is read as JSON (never modified on disk); an injection changes its event list the
way the problem would have changed the recording, and :func:`write_doc` writes the copy into the
test's ``tmp_path``.  The basic move is :func:`insert_pause`: from time ``t`` on, everything
happens ``d`` us later (CPU events that span ``t`` last ``d`` longer; kernels already running at
``t`` do not), optionally with a new CPU event filling the pause (the cause: a data-loader fetch,
a ``cudaStreamSynchronize``, ...).  Every helper returns what it added, so tests can state the
injected magnitude exactly.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

__all__ = [
    "add_event", "cpu_thread", "device_event", "gpu_stream", "insert_pause", "load_doc", "new_correlation",
    "runtime_call", "step_starts", "write_doc",
]

#: categories of device-side events (they never stretch: the GPU does not pause with the CPU).
DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "gpu_user_annotation"}


def load_doc(path: str | Path) -> dict[str, Any]:
    """The trace file's JSON (``.json`` or ``.json.gz``)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def write_doc(doc: dict[str, Any], directory: Path, name: str = "injected.json") -> Path:
    """Write the modified trace into ``directory`` (plain JSON) and return its path."""
    path = Path(directory) / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _is_device(event: dict[str, Any]) -> bool:
    return event.get("cat") in DEVICE_CATS


def insert_pause(doc: dict[str, Any], t: float, d: float, cause: dict[str, Any] | None = None,
                 stretch_at_t: tuple[str, ...] = ("ProfilerStep#",)) -> None:
    """Make everything from time ``t`` on happen ``d`` us later.

    Complete events starting at or after ``t`` move by ``d``; CPU events spanning ``t`` (and those
    starting exactly at ``t`` whose name starts with one of ``stretch_at_t``: the step that will
    contain the pause) last ``d`` longer; device events running at ``t`` are unchanged.  Other
    phases with a ``ts`` (flows, instants, counters) move like events starting there.  ``cause``,
    when given, is added as a complete CPU event ``[t, t + d]`` (it fills the pause).
    """
    for event in doc["traceEvents"]:
        ts = event.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        dur = event.get("dur") if event.get("ph") == "X" else None
        if ts == t and dur is not None and str(event.get("name", "")).startswith(stretch_at_t):
            event["dur"] = dur + d
        elif ts >= t:
            event["ts"] = ts + d
        elif dur is not None and ts + dur > t and not _is_device(event):
            event["dur"] = dur + d
    if cause is not None:
        add_event(doc, {**cause, "ts": t, "dur": d})


def add_event(doc: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """Append a complete event (``ph`` "X" unless given) and return it."""
    event = {"ph": "X", "args": {}, **event}
    doc["traceEvents"].append(event)
    return event


def cpu_thread(doc: dict[str, Any]) -> tuple[Any, Any]:
    """(pid, tid) of the thread that records the ProfilerStep annotations (the training loop)."""
    for event in doc["traceEvents"]:
        if event.get("ph") == "X" and str(event.get("name", "")).startswith("ProfilerStep#"):
            return event["pid"], event["tid"]
    raise ValueError("the trace has no ProfilerStep annotation")


def runtime_call(name: str, pid: Any, tid: Any, corr: int, **times: float) -> dict[str, Any]:
    """A CPU runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync``...) with correlation ``corr``."""
    return {"name": name, "cat": "cuda_runtime", "pid": pid, "tid": tid, "args": {"correlation": corr},
            **times}


def device_event(name: str, like: dict[str, Any], corr: int, ts: float, dur: float,
                 cat: str = "kernel") -> dict[str, Any]:
    """A device event on the same GPU and stream as the kernel ``like``."""
    return {"name": name, "cat": cat, "pid": like["pid"], "tid": like["tid"], "ts": ts, "dur": dur,
            "args": {"stream": like["args"]["stream"], "correlation": corr}}


def step_starts(doc: dict[str, Any]) -> list[float]:
    """Start times of the CPU-side ProfilerStep annotations (not their GPU-side copies), sorted."""
    return sorted(e["ts"] for e in doc["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation"
                  and str(e.get("name", "")).startswith("ProfilerStep#"))


def gpu_stream(doc: dict[str, Any], kernel_name_part: str = "") -> dict[str, Any]:
    """A kernel event (the first whose name contains ``kernel_name_part``): its pid/tid/stream
    serve to place injected device events on the same GPU."""
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel" and kernel_name_part in str(event.get("name", "")):
            return event
    raise ValueError(f"the trace has no kernel named like {kernel_name_part!r}")


def new_correlation(doc: dict[str, Any]) -> int:
    """A correlation id no event of the trace uses."""
    used = [e["args"].get("correlation", 0) for e in doc["traceEvents"] if isinstance(e.get("args"), dict)]
    return max([c for c in used if isinstance(c, int)] + [0]) + 1
