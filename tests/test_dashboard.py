"""torchprof dashboard: HTML from a real run's metrics.jsonl (rendered in headless Chromium) and
the wandb workspace built from the same spec, up to the network call."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers.paths import REPO

from torchprof_args import MetricsWriter, Timers
from torchprof_args.analysis.dashboard.render import DEFAULT_SPEC, expand_panels
from torchprof_args.analysis.dashboard.wandb_view import build_wandb_workspace, workspace_json
from torchprof_args.capture.metrics.config import MetricsConfig, WandbConfig
from torchprof_args.console import main as torchprof

# wandb-workspaces still uses pydantic v1-style validators.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(autouse=True)
def _offline(offline_wandb: None) -> None:
    """Every test here runs real wandb offline (conftest.offline_wandb)."""


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A real single-rank run: Timers + MetricsWriter (jsonl and wandb offline) over 40 iterations."""
    timers = Timers(0, "minmax")
    metrics_dir = tmp_path / "run"
    config = MetricsConfig(str(metrics_dir), sinks=("jsonl", "wandb"), wandb=WandbConfig(project="dash"),
                           samples_per_iteration=16, tokens_per_iteration=16 * 64, flops_per_iteration=2e9)
    writer = MetricsWriter(config, timers=timers, rank=0, world_size=1, console=False)
    for iteration in range(1, 41):
        for name, seconds in (("batch-generator", 0.0002),
                              ("forward-backward", 0.0006 + 0.00002 * (iteration % 7))):
            timers(name, log_level=0).start()
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
            timers(name).stop()
        if iteration % 4 == 0:
            writer.log_step(iteration, extra={"flush_seconds": 0.1 * iteration, "trace_mb": 12.0})
    writer.close()
    return metrics_dir


def test_spec_file_in_configs_is_the_built_in_spec() -> None:
    shipped = json.loads((REPO / "configs" / "wandb_dashboard.json").read_text())
    assert shipped == DEFAULT_SPEC, (
        "regenerate with: torchprof dashboard --write-spec configs/wandb_dashboard.json")


def test_expand_panels_from_keys_and_without_keys() -> None:
    keys = [
        "iteration-time", "timers/fwd-time", "timers/fwd-time-min", "timers/opt-time",
        "profiler/trace_mb", "profiler/trace_mb-min", "memory/host-max-rss-gb",
    ]
    sections = dict(expand_panels(DEFAULT_SPEC, keys))
    timer_panels = sections["Timers: max and min across ranks (per iteration)"]
    assert [(p.title, p.keys, p.band) for p in timer_panels] == [
        ("fwd", ["timers/fwd-time", "timers/fwd-time-min"], True),
        ("opt", ["timers/opt-time"], False),
    ]
    assert [p.keys for p in sections["Profiler: max and min across ranks"]] == [
        ["profiler/trace_mb", "profiler/trace_mb-min"]]
    assert "Throughput" not in sections  # no data, no panel
    unknown = dict(expand_panels(DEFAULT_SPEC, None))
    (regex_panel,) = unknown["Timers: max and min across ranks (per iteration)"]
    assert regex_panel.regex == r"^timers/(?P<name>.+)\-time$"


@pytest.mark.slow
def test_html_has_one_svg_plot_per_panel(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = run_dir / "timings.html"
    assert torchprof(["dashboard", str(run_dir), "-o", str(output)]) == 0
    page = output.read_text()
    # iteration time, 2 timers, 3 throughput, host RSS, 2 profiler figures
    assert page.count("<svg") == 9
    assert "<script src" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert 'class="title">forward-backward <tspan class="unit">(ms)</tspan>' in page
    assert page.count("<polyline") >= 9 and "class=\"band\"" in page


def test_heatmap_panels_draw_the_per_rank_series() -> None:
    """A straggler-score panel per timer with a per-rank series (the one heatmap, tests/test_heatmap.py:
    folding, colours), its scores as given, at the line panels' width; none without the series."""
    from torchprof_args.analysis.dashboard.render import render_html
    from torchprof_args.shared.metrics_log import MetricsRecord

    records = [MetricsRecord(i, 100.0 + i, {"stragglers/fwd-score-max": 1.5},
                             {"stragglers/fwd-score": [1.0, 1.5 if i >= 4 else 1.0]})
               for i in range(2, 12, 2)]
    page = render_html(records, DEFAULT_SPEC)
    assert page.count('<svg class="panel heatmap"') == 1 and 'width="420"' in page
    assert 'class="title">fwd (x median, per rank)' in page
    assert "<title>rank 1, iteration 4: 1.50x</title>" in page
    assert "2x+ (white: the other ranks' median)" in page
    bare = [MetricsRecord(r.iteration, r.timestamp, r.metrics) for r in records]
    assert 'class="panel heatmap"' not in render_html(bare, DEFAULT_SPEC)


def test_missing_metrics_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert torchprof(["dashboard", str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="chromium is not installed (apt-get install chromium)")
def test_html_renders_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    from PIL import Image

    output = run_dir / "timings.html"
    assert torchprof(["dashboard", str(run_dir), "-o", str(output)]) == 0
    flags = [
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--no-first-run", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [*flags, "--dump-dom", output.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert dom.count("<svg") == 9 and dom.count("<polyline") >= 9
    screenshot = tmp_path / "timings.png"
    subprocess.run(
        [*flags, f"--screenshot={screenshot}", "--window-size=1400,1800", output.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )
    image = Image.open(screenshot).convert("RGB")
    assert image.size == (1400, 1800)
    colours = image.getcolors(maxcolors=1_000_000)
    assert len(colours) > 500  # lines, bands, text: far from a blank page
    # the series colours are drawn: the first palette colour (#1f77b4) appears on many pixels
    blue = sum(count for count, rgb in colours
               if abs(rgb[0] - 0x1F) < 40 and abs(rgb[1] - 0x77) < 40 and abs(rgb[2] - 0xB4) < 40)
    assert blue > 1000


@pytest.mark.slow
def test_wandb_workspace_has_the_same_panels(run_dir: Path) -> None:
    keys = sorted({k for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                   for k in json.loads(line)["metrics"]})
    workspace = build_wandb_workspace(DEFAULT_SPEC, keys, entity="team", project="dash")
    titles = {section.name: [panel.title for panel in section.panels] for section in workspace.sections}
    assert titles["Timers: max and min across ranks (per iteration)"] == [
        "batch-generator (s)", "forward-backward (s)"]
    model = workspace_json(workspace)
    assert model["entity"] == "team" and model["project"] == "dash"
    panels = [p for s in model["spec"]["section"]["panel_bank_config"]["sections"] for p in s["panels"]]
    assert len(panels) == 9
    assert all(p["config"]["x_axis"] == "iteration" for p in panels)
    assert ["timers/forward-backward-time", "timers/forward-backward-time-min"] in [
        p["config"]["metrics"] for p in panels]


def test_wandb_command_dry_run_and_refusal_without_credentials(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert json.loads((run_dir / "wandb_run.json").read_text())["mode"] == "offline"
    assert torchprof(["dashboard", str(run_dir), "--wandb", "--dry-run", "--entity", "team"]) == 0
    model = json.loads(capsys.readouterr().out)
    assert model["project"] == "dash" and model["display_name"] == "torchprof step timings"
    # Without credentials the command stops before any network call, and says what to do.
    assert torchprof(["dashboard", str(run_dir), "--wandb", "--entity", "team"]) == 2
    err = capsys.readouterr().err
    assert "needs wandb credentials" in err and "wandb sync" in err
