"""The Prometheus names of the metrics: what the in-job sink (``metrics/prometheus.py``) exports and
the Grafana dashboard (``torchprof dashboard --grafana``) queries, defined once for both sides.
"""

from __future__ import annotations

import re

__all__ = ["PER_RANK_SUFFIX", "PREFIX", "metric_name"]

#: Every metric's name starts with this.
PREFIX = "torchprof_"
#: A per-rank series' name ends with this (a ``rank`` label on each sample).
PER_RANK_SUFFIX = "_by_rank"
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]+")


def metric_name(key: str) -> str:
    """The Prometheus name of a metrics key: ``torchprof_`` + the key, each run of characters other
    than letters and digits replaced by ``_``."""
    return PREFIX + _NON_ALNUM.sub("_", key)
