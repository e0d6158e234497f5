"""The step-timing dashboard's panel spec as a wandb workspace view (``torchprof dashboard --wandb``).

The same spec as the HTML page (:mod:`~torchprof_args.analysis.dashboard.render`), so both show the
same panels.  Building the view needs the ``wandb-workspaces`` package and no network; saving it
(``workspace.save()``) is the network call, made by the command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchprof_args.analysis.dashboard.render import expand_panels

__all__ = ["build_wandb_workspace", "workspace_json"]


def build_wandb_workspace(
    spec: Mapping[str, Any], keys: Sequence[str] | None, *, entity: str, project: str, name: str | None = None
) -> Any:
    """The ``wandb_workspaces`` Workspace (a saved view) with the spec's panels; no network.

    Args:
        spec: the panel spec (:data:`~torchprof_args.analysis.dashboard.spec.DEFAULT_SPEC`'s shape).
        keys: the metric keys of the run (from its metrics.jsonl), so per-timer panels can be laid
            out; ``None`` gives one regex panel per repeated group instead.
        entity, project: where the view is saved.
        name: the view's name (default: the spec's title).

    Returns:
        A ``wandb_workspaces.workspaces.Workspace``; raises ImportError (saying what to install)
        without the ``wandb-workspaces`` package.
    """
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError:
        raise ImportError(
            "the wandb dashboard needs the wandb-workspaces package: pip install wandb-workspaces"
        ) from None
    x_key = spec.get("x", "iteration")
    sections = []
    for section_name, panels in expand_panels(spec, keys):
        plots: list[Any] = []
        for panel in panels:
            title = f"{panel.title} ({panel.unit})" if panel.unit else panel.title
            if panel.regex is not None:
                plots.append(wr.LinePlot(title=title, x=x_key, metric_regex=panel.regex))
            else:
                plots.append(wr.LinePlot(title=title, x=x_key, y=list(panel.keys)))
        sections.append(ws.Section(name=section_name, panels=plots, is_open=True))
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name or spec.get("title", "torchprof step timings"),
        sections=sections,
    )


def workspace_json(workspace: Any) -> dict[str, Any]:
    """The view exactly as it would be sent to wandb (``wandb_workspaces``' own model)."""
    return workspace._to_model().model_dump(mode="json")  # noqa: SLF001
