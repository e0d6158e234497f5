"""The step-timing dashboard's panels, as data (also shipped as ``configs/wandb_dashboard.json``)."""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_SPEC"]


def _hardware_heatmap(key: str, title: str) -> dict[str, Any]:
    """A rank x interval heatmap of one NVML reading, relative to each interval's median."""
    return {"kind": "heatmap", "per_rank": key, "relative": True, "title": title, "unit": "x median",
            "y": [key, f"{key}-min"], "labels": ["max across ranks", "min across ranks"], "band": True}


#: The dashboard: sections of line panels over ``x``.  A panel with ``for_each`` is repeated
#: for every metric key matching the pattern (``{name}`` is the varying part; names matching
#: ``skip`` are left out); ``band`` shades between the first two series (max and min).  A panel
#: with ``"kind": "heatmap"`` draws ``per_rank`` (a key of the records' per-rank series) as a
#: rank x iteration heatmap in the HTML page (``relative``: each value over its interval's median
#: across ranks); wandb, which has no per-rank series, plots ``y``.
DEFAULT_SPEC: dict[str, Any] = {
    "title": "torchprof step timings",
    "x": "iteration",
    "sections": [
        {
            "name": "Step time",
            "panels": [{"title": "iteration time", "unit": "s", "y": ["iteration-time"]}],
        },
        {
            "name": "Timers: max and min across ranks (per iteration)",
            "panels": [
                {
                    "for_each": "timers/{name}-time",
                    "title": "{name}",
                    "unit": "s",
                    "y": ["timers/{name}-time", "timers/{name}-time-min"],
                    "labels": ["max across ranks", "min across ranks"],
                    "band": True,
                }
            ],
        },
        {
            "name": "Stragglers: each rank's time over the median of the other ranks",
            "panels": [
                {
                    "for_each": "stragglers/{name}-score-max",
                    "kind": "heatmap",
                    "per_rank": "stragglers/{name}-score",
                    "title": "{name}",
                    "unit": "x median",
                    "y": ["stragglers/{name}-score-max"],
                    "labels": ["slowest rank's time / the others' median"],
                }
            ],
        },
        {
            "name": "Throughput",
            "panels": [
                {"title": "samples per second", "unit": "samples/s", "y": ["throughput/samples-per-sec"]},
                {"title": "tokens per second", "unit": "tokens/s", "y": ["throughput/tokens-per-sec"]},
                {"title": "TFLOP/s per GPU", "unit": "TFLOP/s", "y": ["throughput"]},
                {"title": "MFU (model FLOPs utilisation)", "unit": "% of peak", "y": ["mfu"]},
            ],
        },
        {
            "name": "Memory (max across ranks)",
            "panels": [
                {
                    "title": "device memory",
                    "unit": "GB",
                    "y": ["memory/max-allocated-gb", "memory/max-reserved-gb"],
                    "labels": ["max allocated", "max reserved"],
                },
                {"title": "host peak RSS", "unit": "GB", "y": ["memory/host-max-rss-gb"]},
                {"title": "allocator fragmentation (peak reserved - peak allocated)", "unit": "GB",
                 "y": ["memory/fragmentation-gb"]},
                {
                    "title": "allocator retries and OOMs (since start)",
                    "unit": "count",
                    "y": ["memory/alloc-retries", "memory/ooms"],
                    "labels": ["cudaMalloc retries", "OOMs"],
                },
            ],
        },
        {
            "name": "GPU hardware: each rank over the median of all ranks (NVML)",
            "panels": [
                _hardware_heatmap("gpu/sm-clock-mhz", "SM clock"),
                _hardware_heatmap("gpu/power-w", "power"),
                _hardware_heatmap("gpu/temperature-c", "temperature"),
            ],
        },
        {
            "name": "Profiler: max and min across ranks",
            "panels": [
                {
                    "for_each": "profiler/{name}",
                    "skip": "-min$",
                    "title": "{name}",
                    "unit": "",
                    "y": ["profiler/{name}", "profiler/{name}-min"],
                    "labels": ["max across ranks", "min across ranks"],
                    "band": True,
                }
            ],
        },
    ],
}
