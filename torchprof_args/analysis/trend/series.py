"""The series ``torchprof trend`` compares, read from one input (a run or a cycle of one).

From a run's ``metrics.jsonl`` (its ``--metrics-dir``), one sample per logged interval (per step
with ``--log-interval 1``), the first ``skip_first`` intervals of each process left out (warm-up):
``iteration-time``, every ``timers/<name>-time``, ``throughput`` and ``mfu`` (higher is better).

From traces (a profile directory, or one cycle folder), per cycle: ``trace/step-ms`` (each profiled
step's slowest rank, one sample per step) and ``diagnose/<kind>`` (each finding's
``saving_ms_per_step``, 0 where the cycle does not have it; one sample per cycle), through the
summary sidecars where they match (else each trace is parsed).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from torchprof_args.errors import TraceError
from torchprof_args.naming import METRICS_FILENAME, TRACE_SUFFIX

__all__ = ["RunData", "Series", "read_input"]

#: metrics.jsonl keys compared: exact names, then patterns.
_METRIC_KEYS = ("iteration-time", "throughput", "mfu")
_METRIC_PATTERNS = (re.compile(r"^timers/.+-time$"),)
_HIGHER_IS_BETTER = ("throughput", "mfu")
_UNITS = {"iteration-time": "s", "throughput": "TFLOP/s", "mfu": "%"}


@dataclasses.dataclass
class Series:
    """One quantity's samples in one input."""

    name: str
    unit: str
    higher_is_better: bool
    samples: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RunData:
    """One input: its path, a short label and its series by name."""

    path: str
    label: str
    series: dict[str, Series] = dataclasses.field(default_factory=dict)

    def add(self, name: str, unit: str, value: float, higher_is_better: bool = False) -> None:
        self.series.setdefault(name, Series(name, unit, higher_is_better)).samples.append(float(value))


def read_input(path: str, *, skip_first: int = 1) -> RunData:
    """Every series of ``path`` (a metrics directory, a ``metrics.jsonl``, a profile directory or a
    cycle folder, or a directory with both); :class:`TraceError` when it has none."""
    location = Path(path)
    data = RunData(path, location.name or path)
    metrics = location if location.is_file() else location / METRICS_FILENAME
    if metrics.is_file():
        _from_metrics(data, metrics, skip_first)
    if location.is_dir():
        _from_traces(data, location)
    if not data.series:
        raise TraceError(
            f"{path}: neither a {METRICS_FILENAME} with logged intervals nor profiler traces "
            "(give a run's --metrics-dir or --torch-profile-dir, or a cycle folder)"
        )
    return data


def _from_metrics(data: RunData, path: Path, skip_first: int) -> None:
    from torchprof_args.shared.metrics_log import read_runs

    try:
        segments = read_runs(path)
    except ValueError as err:
        raise TraceError(str(err)) from None
    for segment in segments:
        for record in segment.records[skip_first:]:
            for key, value in record.metrics.items():
                if key in _METRIC_KEYS or any(p.match(key) for p in _METRIC_PATTERNS):
                    data.add(key, _UNITS.get(key, "s"), value, key in _HIGHER_IS_BETTER)


def _from_traces(data: RunData, location: Path) -> None:
    from torchprof_args.analysis.collect.discover import expand, group_by_cycle
    from torchprof_args.analysis.collect.pool import collect
    from torchprof_args.analysis.collect.trace_results import DIAGNOSIS
    from torchprof_args.analysis.diagnose.job_findings import diagnose
    from torchprof_args.analysis.diagnose.registry import KINDS

    try:
        files = [f for f in expand([location]) if TRACE_SUFFIX in f.name]  # not wandb's or other JSON
    except TraceError:
        return  # no traces here: a metrics directory only
    for cycle in group_by_cycle(files):
        ranks = collect(cycle.files, parts=(DIAGNOSIS,)).diagnoses
        if not ranks:
            continue
        per_step: dict[int, float] = {}
        for rank in ranks:
            for index, step in enumerate(rank.steps):
                per_step[index] = max(per_step.get(index, 0.0), step.dur_us / 1e3)
        for index in sorted(per_step):
            data.add("trace/step-ms", "ms", per_step[index])
        savings = {f.kind: f.saving_ms_per_step for f in diagnose(ranks, cycle.label).findings}
        for kind in KINDS:
            data.add(f"diagnose/{kind}", "ms", savings.get(kind, 0.0))
