"""The step-timing dashboard as a Grafana dashboard over the Prometheus sink's series.

Built from the same panel spec as the HTML page and the wandb view (:data:`DEFAULT_SPEC`,
``configs/wandb_dashboard.json``): one row per section; a line panel per spec panel, each key as
the PromQL series ``torchprof_<key>`` (:func:`~torchprof_args.capture.metrics.prometheus.metric_name`); a
heatmap panel per heatmap (the per-rank series ``<name>_by_rank``, one row per ``rank``; readings
marked ``relative`` divided by their median across ranks).  A ``for_each`` panel becomes a
dashboard variable whose values are the ``{name}`` parts of the scraped metric names (Grafana's
``metrics()`` query, its regex's capture group) and a panel repeated for each value.  The
Prometheus data source is a variable too (``datasource``), so the JSON imports anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torchprof_args.shared.prometheus_names import PER_RANK_SUFFIX, PREFIX, metric_name

__all__ = ["grafana_dashboard", "pattern_regex"]

_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_UNITS = {"s": "s", "GB": "decgbytes", "%": "percent", "% of peak": "percent", "count": "short",
          "x median": "short"}
_WIDTH, _HEIGHT = 12, 8


def pattern_regex(pattern: str, suffix: str = "", skip: str | None = None) -> str:
    """The Grafana variable regex for a spec pattern (``timers/{name}-time``): the Prometheus names
    it covers, ``{name}`` as the capture group; ``skip`` (a regex on the name) left out."""
    head, _, tail = pattern.partition("{name}")
    exclude = [re.escape(PER_RANK_SUFFIX)] if not tail and not suffix else []  # the name runs to the end
    if skip:
        exclude.append(skip.replace("-", "_"))
    lookahead = f"(?!.*(?:{'|'.join(exclude)})$)" if exclude else ""
    return f"^{re.escape(metric_name(head))}{lookahead}(.+){re.escape(_tail(tail) + suffix)}$"


def _tail(text: str) -> str:
    """The Prometheus form of a key's part after ``{name}`` (``-time-min`` -> ``_time_min``)."""
    return metric_name(text)[len(PREFIX):] if text else ""


def _expr(key: str, variable: str | None = None, per_rank: bool = False, relative: bool = False) -> str:
    """The PromQL of one key (``{name}`` in it: the dashboard variable ``variable``)."""
    if variable is not None and "{name}" in key:
        head, _, tail = key.partition("{name}")
        name = f"{metric_name(head)}${{{variable}}}{_tail(tail)}"
    else:
        name = metric_name(key)
    name += PER_RANK_SUFFIX if per_rank else ""
    if relative:
        return f"{name} / on() group_left() quantile(0.5, {name})"
    return name


class _Layout:
    """Grafana's grid: 24 columns, panels two to a row, a row panel per section."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        if self.x:
            self.y += _HEIGHT
            self.x = 0
        self.panels.append({"id": self._id(), "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def add(self, panel: dict[str, Any]) -> None:
        panel["id"] = self._id()
        panel["gridPos"] = {"h": _HEIGHT, "w": _WIDTH, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += _WIDTH
        if self.x >= 24:
            self.x = 0
            self.y += _HEIGHT

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def _panel(entry: Mapping[str, Any], variable: str | None) -> dict[str, Any]:
    """One spec panel as a Grafana panel (``variable``: the ``{name}`` of a repeated panel)."""
    unit = entry.get("unit", "")
    title = entry.get("title", "")
    if variable is not None:
        title = title.replace("{name}", f"${variable}")
    defaults = {"unit": _UNITS.get(unit, "short")}
    panel: dict[str, Any] = {"title": f"{title} ({unit})" if unit else title, "datasource": _DATASOURCE,
                             "fieldConfig": {"defaults": defaults, "overrides": []}}
    if variable is not None:
        panel.update({"repeat": variable, "repeatDirection": "h", "maxPerRow": 2})
    if entry.get("kind") == "heatmap" and entry.get("per_rank"):
        key = entry["per_rank"]
        panel.update({"type": "heatmap", "targets": [{
            "refId": "A", "datasource": _DATASOURCE, "format": "time_series", "legendFormat": "rank {{rank}}",
            "expr": _expr(key, variable, per_rank=True, relative=bool(entry.get("relative")))}],
            "options": {"calculate": False, "yAxis": {"axisLabel": "rank"}, "cellGap": 1,
                        "color": {"mode": "scheme", "scheme": "RdBu", "reverse": True},
                        "tooltip": {"show": True, "yHistogram": False}}})
        return panel
    labels = list(entry.get("labels", []))
    targets = []
    for index, key in enumerate(entry.get("y", [])):
        targets.append({"refId": chr(ord("A") + index), "datasource": _DATASOURCE,
                        "legendFormat": labels[index] if index < len(labels) else key,
                        "expr": _expr(key, variable)})
    panel.update({"type": "timeseries", "targets": targets})
    return panel


def _variable(name: str, regex: str) -> dict[str, Any]:
    definition = "metrics(torchprof_)"
    return {"name": name, "type": "query", "datasource": _DATASOURCE, "definition": definition,
            "query": {"query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "regex": f"/{regex}/", "multi": True, "includeAll": True, "refresh": 2, "hide": 0, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def grafana_dashboard(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The Grafana dashboard (JSON model, schema 39) of ``spec``'s panels over the Prometheus series."""
    layout = _Layout()
    variables: list[dict[str, Any]] = [{
        "name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus",
        "current": {}, "hide": 0, "refresh": 1}]
    for section in spec.get("sections", []):
        layout.row(section.get("name", ""))
        for entry in section.get("panels", []):
            pattern = entry.get("for_each")
            if pattern is None:
                layout.add(_panel(entry, None))
                continue
            name = re.sub(r"\W+", "_", pattern.partition("{name}")[0]).strip("_") or "name"
            name = f"{name}_{len(variables)}" if any(v["name"] == name for v in variables) else name
            if entry.get("kind") == "heatmap" and entry.get("per_rank"):
                regex = pattern_regex(entry["per_rank"], PER_RANK_SUFFIX)
            else:
                regex = pattern_regex(pattern, skip=entry.get("skip"))
            variables.append(_variable(name, regex))
            layout.add(_panel(entry, name))
    return {"title": spec.get("title", "torchprof step timings"), "uid": "torchprof-step-timings",
            "schemaVersion": 39, "editable": True, "time": {"from": "now-1h", "to": "now"}, "refresh": "10s",
            "tags": ["torchprof"], "templating": {"list": variables}, "panels": layout.panels,
            "annotations": {"list": []}}
