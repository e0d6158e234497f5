"""The one rank x interval heatmap (torchprof_args/shared/heatmap.py), drawn by the dashboard and the
HTML report: what a cell is against, its colour around 1.0, folding and tooltips for large jobs."""

from __future__ import annotations

import re

import pytest

from torchprof_args.shared.heatmap import MAX_CELL_TITLES, Layout, grid, heatmap_svg

DASHBOARD = Layout(width=344, height=174, max_rows=128, max_columns=240)
REPORT = Layout(width=900, height=1024, max_rows=1024, max_columns=150)


def _fills(svg: str) -> list[str]:
    """Every cell's fill, row by row (the legend's swatches have a stroke, the frame no fill)."""
    return re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="[\d.]+" fill="(#\w+)"/?>', svg)


def test_each_cell_is_against_its_reference() -> None:
    """``others``: over the median of the other ranks (the straggler score); ``median``: over the
    median of all; ``score``: as given.  A lone value is 1; a missing one None."""
    columns = [("1", [10.0, 12.0, 14.0, None]), ("2", [5.0, float("nan"), None, None])]
    others = grid(columns, "others", REPORT).cells
    ratios = [cell and round(cell[0], 3) for cell in (others[0][0], others[1][0], others[2][0])]
    assert ratios == [0.769, 1.0, 1.273]
    assert others[0][1] == (1.0, 5.0) and others[1][1] is None and others[3] == [None, None]
    median = grid([("1", [1.0, 2.0, 3.0])], "median", REPORT).cells
    assert [row[0] for row in median] == [(0.5, 1.0), (1.0, 2.0), (1.5, 3.0)]
    assert grid([("1", [1.3, None])], "score", REPORT).cells == [[(1.3, 1.3)], [None]]


def test_colour_is_white_at_one_dark_red_at_span_dark_blue_at_its_inverse() -> None:
    svg = heatmap_svg("t", [("1", [1.0, 2.0, 3.0, 0.5, 0.25, 1.5, None])], DASHBOARD, span=2.0)
    assert _fills(svg) == ["#ffffff", "#b2182b", "#b2182b", "#2166ac", "#2166ac", "#d88c95", "#dddddd"]
    assert ">0.5x</text>" in svg and "2x+ (white: the other ranks' median)" in svg


def test_fitted_span_follows_the_spread() -> None:
    """Without ``span``, dark red is at 1 + the 99th percentile of the distances from 1."""
    svg = heatmap_svg("t", [("1", [1.0] * 99 + [1.04])], REPORT)
    assert "1.04x+" in svg and _fills(svg)[-1] == "#b2182b"
    assert "1.01x+" in heatmap_svg("t", [("1", [1.0, 1.0])], REPORT)  # at least 1 %


def test_tooltips_per_cell_name_rank_interval_value_and_ratio() -> None:
    svg = heatmap_svg("steps", [("#3", [1000.0, 1200.0])], REPORT, against="others", x_name="step",
                      ranks=[4, 7], fmt=lambda us: f"{us / 1e3:.1f} ms")
    assert "<title>rank 7, step #3: 1.2 ms, 1.20x</title>" in svg
    assert "<title>rank 4, step #3: 1.0 ms, 0.83x</title>" in svg
    assert ">7</text>" in svg and ">step</text>" in svg and ">rank</text>" in svg


def test_large_jobs_fold_into_buckets_showing_their_maximum() -> None:
    """512 ranks x 600 intervals on the dashboard: 128 x 200 cells, each its bucket's largest
    score; too many cells to title each, so one tooltip per row."""
    columns = []
    for iteration in range(1, 601):
        scores = [1.0] * 512
        scores[301] = 1.9 if iteration >= 400 else 1.0  # rank 301 turns slow at iteration 400
        columns.append((f"{iteration}", scores))
    g = grid(columns, "score", DASHBOARD)
    assert len(g.rows) == DASHBOARD.max_rows and len(g.columns) == 200  # buckets of 4 ranks, 3 intervals
    row, column = g.rows.index("300-303"), g.columns.index("402")  # iterations 400-402
    assert g.cells[row][column] == (1.9, 1.9) and g.cells[row][column - 1] == (1.0, 1.0)
    assert g.cells[row - 1][column] == (1.0, 1.0)
    svg = heatmap_svg("fwd", columns, DASHBOARD, span=2.0)
    assert MAX_CELL_TITLES < 128 * 200 and svg.count("<title>") == 128 and len(_fills(svg)) == 128 * 200
    assert "<title>rank 300-303: 3 1.00x, " in svg and ", 402 1.90x, " in svg


@pytest.mark.parametrize("ranks, rows, height",
                         [(1024, 1024, "1.05"), (2048, 1024, "1.05"), (16, 16, "14.05")])
def test_a_row_per_rank_one_pixel_high_for_1024_ranks(ranks: int, rows: int, height: str) -> None:
    """The report's layout: up to 1,024 rows (one pixel each at 1,024), 14 px at most; more ranks fold."""
    svg = heatmap_svg("t", [("#1", [1.0] * ranks), ("#2", [1.0] * ranks)], REPORT)
    cells = re.findall(r'<rect x="62" y="[\d.]+" width="80.05" height="([\d.]+)" fill=', svg)
    assert len(cells) == rows and set(cells) == {height}
