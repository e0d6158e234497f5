"""Who wrote a trace: host, profiled iterations and parallel coordinates (dp, tp, pp, cp, ep).

Used by the cross-rank views to say where a slow rank sits ("rank 17 on node03, tp 1 pp 2").
Sources, first that answers:

* the ``torchprof_args`` metadata this package stores in every trace it writes (``host``,
  ``iterations``, and ``parallel`` when megatron-core's parallel state was initialised);
* Kineto's ``host_name`` (recent torch writes it);
* Kineto's ``distributedInfo.pg_config``: the process groups this rank belongs to, with the
  descriptions megatron-core gives them (``TENSOR_MODEL_PARALLEL_GROUP``...): a rank's coordinate
  on an axis is its position in that group's rank list;
* the file name (``rank00003_<host>_pid<pid>``) and the cycle folder (``iter000120-000121``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchprof_args.analysis.trace import Trace
from torchprof_args.naming import cycle_of_name, host_from_file_name

__all__ = ["PARALLEL_AXES", "Origin", "device_name", "origin", "parallel_from_pg_config"]

#: megatron-core's process-group descriptions, per parallel axis (the first that matches wins).
PARALLEL_AXES = {
    "dp": ("DATA_PARALLEL_GROUP",),
    "tp": ("TENSOR_MODEL_PARALLEL_GROUP",),
    "pp": ("PIPELINE_MODEL_PARALLEL_GROUP",),
    "cp": ("CONTEXT_PARALLEL_GROUP",),
    "ep": ("EXPERT_MODEL_PARALLEL_GROUP",),
}
class Origin(msgspec.Struct, frozen=True):
    """Who wrote a trace (each None when nothing says).

    Attributes:
        host: the host the rank ran on.
        iterations: the first and last profiled iteration.
        parallel: the rank's coordinate per parallel axis (``dp``, ``tp``, ``pp``, ``cp``, ``ep``).
    """

    host: str | None
    iterations: list[int] | None
    parallel: dict[str, int] | None


def parallel_from_pg_config(info: dict[str, Any]) -> dict[str, int] | None:
    """Coordinates from ``distributedInfo`` (``rank`` and ``pg_config``), or None without any."""
    rank = info.get("rank")
    groups = info.get("pg_config")
    if not isinstance(rank, int) or not isinstance(groups, list):
        return None
    out: dict[str, int] = {}
    for axis, descs in PARALLEL_AXES.items():
        for group in groups:
            if not isinstance(group, dict) or group.get("pg_desc") not in descs:
                continue
            ranks = group.get("ranks")
            if isinstance(ranks, list) and rank in ranks:
                out[axis] = ranks.index(rank)
                break
    return out or None


def origin(trace: Trace) -> Origin:
    """Who wrote ``trace``, from the first source that says (the module's docstring lists them)."""
    ours = trace.metadata.get("torchprof_args")
    ours = ours if isinstance(ours, dict) else {}
    host = next((h for h in (ours.get("host"), trace.metadata.get("host_name")) if isinstance(h, str) and h),
                None) or host_from_file_name(trace.path.name)
    iterations = ours.get("iterations")
    if not (isinstance(iterations, list) and len(iterations) == 2
            and all(isinstance(i, int) for i in iterations)):
        found = (cycle_of_name(trace.path.parent.name, folder=True)
                 or cycle_of_name(trace.path.name, folder=False))
        iterations = list(found) if found else None
    parallel = ours.get("parallel")
    if not (isinstance(parallel, dict) and all(isinstance(v, int) for v in parallel.values())):
        info = trace.metadata.get("distributedInfo")
        parallel = parallel_from_pg_config(info) if isinstance(info, dict) else None
    return Origin(host=host, iterations=iterations, parallel=parallel)


def device_name(trace: Trace) -> str | None:
    """The trace's GPU name (``deviceProperties``), None when it has none."""
    props = trace.metadata.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        name = props[0].get("name")
        return name if isinstance(name, str) else None
    return None
