"""``torchprof dashboard``: the step-timing dashboard, as a self-contained HTML page or a wandb view.

    torchprof dashboard RUN_DIR -o timings.html         # from RUN_DIR/metrics.jsonl, no network
    torchprof dashboard RUN_DIR --wandb --dry-run       # print the wandb workspace it would save
    torchprof dashboard RUN_DIR --wandb                 # save it (needs wandb login and a synced run)
    torchprof dashboard --grafana grafana.json          # the same panels as a Grafana dashboard (Prometheus)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from torchprof_args.atomic import write_text_atomically
from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError
from torchprof_args.shared.metrics_log import MetricsRecord, read_records

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
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


def _metrics_path(run_dir: str) -> Path:
    from torchprof_args.naming import METRICS_FILENAME

    path = Path(run_dir)
    return path if path.is_file() else path / METRICS_FILENAME


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.dashboard.render import DEFAULT_SPEC, load_spec

    if args.write_spec:
        write_text_atomically(Path(args.write_spec), json.dumps(DEFAULT_SPEC, indent=2) + "\n")
        return 0
    try:
        spec = load_spec(args.spec)
    except ValueError as err:
        raise CommandError(str(err)) from None
    if args.grafana:
        from torchprof_args.analysis.dashboard.grafana import grafana_dashboard

        write_text_atomically(Path(args.grafana), json.dumps(grafana_dashboard(spec), indent=2) + "\n")
        print(f"wrote {args.grafana}")
        return 0
    if not args.run_dir:
        raise CommandError("give RUN_DIR (the --metrics-dir of a run), --grafana JSON or --write-spec JSON.")
    metrics_path = _metrics_path(args.run_dir)
    if not metrics_path.is_file() and not args.wandb:
        raise CommandError(f"{metrics_path} not found: point RUN_DIR at a run's --metrics-dir.")
    records = _records(metrics_path) if metrics_path.is_file() else None
    if args.wandb:
        return _save_wandb_view(args, spec, records)
    from torchprof_args.analysis.dashboard.render import render_html

    output = Path(args.output) if args.output else metrics_path.parent / "timings.html"
    write_text_atomically(output, render_html(records or [], spec, source=str(metrics_path)))
    print(f"wrote {output}")
    return 0


def _records(metrics_path: Path) -> list[MetricsRecord]:
    try:
        return read_records(metrics_path)
    except ValueError as err:
        raise CommandError(str(err)) from None


def _run_info(run_dir: str) -> dict[str, Any]:
    """The run's wandb_run.json (entity, project, mode, dir), or {} when there is none."""
    from torchprof_args.naming import WANDB_RUN_FILENAME

    run_file = Path(run_dir) / WANDB_RUN_FILENAME
    if not run_file.is_file():
        return {}
    try:
        info = json.loads(run_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CommandError(f"{run_file}: cannot read ({err}); pass --entity and --project instead.") from None
    if not isinstance(info, dict):
        raise CommandError(f"{run_file}: not a JSON object; pass --entity and --project instead.")
    return info


def _save_wandb_view(args: argparse.Namespace, spec: dict[str, Any],
                     records: list[MetricsRecord] | None) -> int:
    from torchprof_args.analysis.dashboard.wandb_view import build_wandb_workspace, workspace_json
    from torchprof_args.capture.metrics.config import wandb_credentials_present

    run_info = _run_info(args.run_dir)
    entity = args.entity or run_info.get("entity")
    project = args.project or run_info.get("project")
    if not project:
        raise CommandError("--wandb needs --project (no wandb_run.json in RUN_DIR to take it from).")
    if not entity and not args.dry_run:
        raise CommandError("--wandb needs --entity (the run was logged without one): pass your wandb user "
                           "or team.")
    keys = sorted({k for r in records for k in r.metrics}) if records else None
    try:
        workspace = build_wandb_workspace(spec, keys, entity=entity or "ENTITY", project=project,
                                          name=args.view_name)
    except ImportError as err:
        raise CommandError(str(err)) from None
    if args.dry_run:
        print(json.dumps(workspace_json(workspace), indent=2))
        return 0
    offline = run_info.get("mode") == "offline" and run_info.get("dir")
    sync = f"wandb sync {Path(run_info['dir']).parent}" if offline else ""
    if not wandb_credentials_present():
        raise CommandError("--wandb needs wandb credentials: run `wandb login` or set WANDB_API_KEY."
                           + (f" Upload the offline run too: {sync}" if sync else ""))
    if sync:
        print(f"note: the run was logged offline; upload it with: {sync}")
    workspace.save()  # the network call
    print(f"saved wandb view: {workspace.url}")
    return 0
