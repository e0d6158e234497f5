"""``torchprof dashboard``: the step-timing dashboard, as a self-contained HTML page or a wandb view.

    torchprof dashboard RUN_DIR -o timings.html         # from RUN_DIR/metrics.jsonl, no network
    torchprof dashboard RUN_DIR --wandb --dry-run       # print the wandb workspace it would save
    torchprof dashboard RUN_DIR --wandb                 # save it (needs wandb login and a synced run)
    torchprof dashboard --grafana grafana.json          # the same panels as a Grafana dashboard (Prometheus)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchprof_args.atomic import write_text_atomically
from torchprof_args.metrics.dashboard.render import DEFAULT_SPEC, expand_panels, load_spec, render_html

__all__ = ["build_wandb_workspace", "register", "workspace_json"]


# ---------------------------------------------------------------------------------------------
# wandb workspace


def build_wandb_workspace(
    spec: Mapping[str, Any], keys: Sequence[str] | None, *, entity: str, project: str, name: str | None = None
) -> Any:
    """The ``wandb_workspaces`` Workspace (a saved view) with the spec's panels; no network.

    ``keys`` are the metric keys of the run (from its metrics.jsonl) so per-timer panels can be
    laid out; ``None`` gives one regex panel per repeated group instead.
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
        plots = []
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


# ---------------------------------------------------------------------------------------------
# Command line


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="step-timing dashboard: self-contained HTML from metrics.jsonl, or a wandb workspace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                        help="metrics directory (or its metrics.jsonl)")
    parser.add_argument("-o", "--output", metavar="HTML",
                        help="HTML file to write (default RUN_DIR/timings.html)")
    parser.add_argument("--spec", metavar="JSON",
                        help="panel spec (default: the built-in, configs/wandb_dashboard.json)")
    parser.add_argument("--wandb", action="store_true", help="save the panels as a wandb workspace view")
    parser.add_argument("--entity", help="wandb entity (default: from RUN_DIR/wandb_run.json)")
    parser.add_argument("--project", help="wandb project (default: from RUN_DIR/wandb_run.json)")
    parser.add_argument("--view-name", help="name of the wandb view (default: the spec's title)")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --wandb: print the view as JSON, send nothing")
    parser.add_argument("--write-spec", metavar="JSON", help="write the built-in panel spec to JSON and exit")
    parser.add_argument("--grafana", metavar="JSON",
                        help="write the panels as a Grafana dashboard over the Prometheus sink's series "
                             "(--metrics-sinks prometheus) and exit; import it in Grafana")
    parser.set_defaults(func=_run)


def _fail(message: str) -> int:
    print(f"torchprof dashboard: {message}", file=sys.stderr)
    return 2


def _metrics_path(run_dir: str) -> Path:
    from torchprof_args.naming import METRICS_FILENAME

    path = Path(run_dir)
    return path if path.is_file() else path / METRICS_FILENAME


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.metrics.config import wandb_credentials_present
    from torchprof_args.metrics.sinks import read_metrics_file
    from torchprof_args.naming import WANDB_RUN_FILENAME

    if args.write_spec:
        write_text_atomically(Path(args.write_spec), json.dumps(DEFAULT_SPEC, indent=2) + "\n")
        return 0
    try:
        spec = load_spec(args.spec)
    except ValueError as err:
        return _fail(str(err))
    if args.grafana:
        from torchprof_args.metrics.dashboard.grafana import grafana_dashboard

        write_text_atomically(Path(args.grafana), json.dumps(grafana_dashboard(spec), indent=2) + "\n")
        print(f"wrote {args.grafana}")
        return 0
    if not args.run_dir:
        return _fail("give RUN_DIR (the --metrics-dir of a run), --grafana JSON or --write-spec JSON.")
    metrics_path = _metrics_path(args.run_dir)
    records: list[dict[str, Any]] | None = None
    if metrics_path.is_file():
        try:
            records = read_metrics_file(metrics_path)
        except ValueError as err:
            return _fail(str(err))
    elif not args.wandb:
        return _fail(f"{metrics_path} not found: point RUN_DIR at a run's --metrics-dir.")

    if not args.wandb:
        output = Path(args.output) if args.output else metrics_path.parent / "timings.html"
        write_text_atomically(output, render_html(records or [], spec, source=str(metrics_path)))
        print(f"wrote {output}")
        return 0

    run_info: dict[str, Any] = {}
    run_file = Path(args.run_dir) / WANDB_RUN_FILENAME
    if run_file.is_file():
        run_info = json.loads(run_file.read_text(encoding="utf-8"))
    entity = args.entity or run_info.get("entity")
    project = args.project or run_info.get("project")
    if not project:
        return _fail("--wandb needs --project (no wandb_run.json in RUN_DIR to take it from).")
    if not entity and not args.dry_run:
        return _fail("--wandb needs --entity (the run was logged without one): pass your wandb user or team.")
    keys = sorted({k for r in records for k in r.get("metrics", {})}) if records else None
    try:
        workspace = build_wandb_workspace(
            spec, keys, entity=entity or "ENTITY", project=project, name=args.view_name
        )
    except ImportError as err:
        return _fail(str(err))
    if args.dry_run:
        print(json.dumps(workspace_json(workspace), indent=2))
        return 0
    if not wandb_credentials_present():
        hint = ""
        if run_info.get("mode") == "offline" and run_info.get("dir"):
            hint = f" Upload the offline run too: wandb sync {Path(run_info['dir']).parent}"
        return _fail("--wandb needs wandb credentials: run `wandb login` or set WANDB_API_KEY." + hint)
    if run_info.get("mode") == "offline" and run_info.get("dir"):
        print(f"note: the run was logged offline; upload it with: wandb sync {Path(run_info['dir']).parent}")
    workspace.save()  # the network call
    print(f"saved wandb view: {workspace.url}")
    return 0
