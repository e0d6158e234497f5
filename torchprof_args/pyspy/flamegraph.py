"""Self-contained interactive flamegraphs (SVG with embedded JS, or an HTML page) from stacks.

No Perl, no network: the SVG/HTML carries its own script.  Click a frame to zoom into it, click
the root (or "Reset zoom") to zoom out, hover for the full name and sample share, "Search"
highlights frames matching a regular expression.  Without JavaScript (e.g. an image viewer) the
SVG still shows the full, unzoomed graph with hover titles.

The layout is an icicle (root at the top, callees below), like py-spy's own flamegraphs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import re
from collections.abc import Iterable

from torchprof_args.atomic import write_text_atomically
from torchprof_args.pyspy.parse import NATIVE, PROCESS, PYTHON, THREAD, Frame, Stack, is_own_code

WIDTH = 1200
ROW = 17
TOP = 50
FONT_CHAR_PX = 7.0  # average width of a 12px monospace glyph


@dataclasses.dataclass
class Node:
    """One frame of the merged call tree: its label, kind, whether it is the user's code, and the
    samples of the stacks through it."""

    label: str
    kind: str
    own: bool
    samples: int = 0
    children: dict[str, Node] = dataclasses.field(default_factory=dict)


def build_tree(stacks: Iterable[Stack], root_label: str = "all") -> Node:
    """Merge stacks into one call tree, root first (frames with the same label share a node)."""
    root = Node(root_label, "root", False)
    for stack in stacks:
        root.samples += stack.count
        node = root
        for frame in stack.frames:
            label = frame.label()
            child = node.children.get(label)
            if child is None:
                child = node.children[label] = Node(label, frame.kind, _is_own(frame))
            child.samples += stack.count
            node = child
    return root


def _is_own(frame: Frame) -> bool:
    return frame.kind == PYTHON and is_own_code(frame.path)


def _color(node: Node) -> str:
    digest = hashlib.md5(node.label.encode("utf-8", "replace")).digest()
    a, b = digest[0] / 255, digest[1] / 255
    if node.kind == "root":
        return "rgb(200,200,200)"
    if node.kind in (PROCESS, THREAD):
        shade = int(185 + 30 * a)
        return f"rgb({shade},{shade},{shade + 10})"
    if node.kind == NATIVE:  # aqua-blue
        return f"rgb({int(80 + 50 * a)},{int(165 + 50 * b)},{int(205 + 40 * a)})"
    if node.own:  # the user's code: red-orange
        return f"rgb({int(225 + 30 * a)},{int(90 + 60 * b)},{int(40 + 30 * a)})"
    if node.kind == PYTHON:  # libraries and the standard library: yellow-orange
        return f"rgb({int(225 + 30 * a)},{int(165 + 55 * b)},{int(50 + 40 * a)})"
    return f"rgb({int(200 + 40 * a)},{int(120 + 40 * b)},{int(170 + 40 * a)})"  # unknown: pink


_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _esc(text: str) -> str:
    return html.escape(_XML_INVALID.sub("?", text), quote=True)


def _fit(label: str, width_px: float) -> str:
    chars = int((width_px - 6) / FONT_CHAR_PX)
    if chars < 3:
        return ""
    return label if len(label) <= chars else label[: chars - 2] + ".."


_SCRIPT = r"""
(function () {
  var svg = document.getElementById("fg-root");
  var W = %(width)d, PAD = 10, CHAR = %(char)s;
  var frames = Array.prototype.slice.call(svg.querySelectorAll("g.fr"));
  var details = document.getElementById("fg-details");
  var zoomLabel = document.getElementById("fg-unzoom");
  var matchedLabel = document.getElementById("fg-matched");
  function num(g, k) { return parseFloat(g.getAttribute("data-" + k)); }
  function fit(g, w) {
    var t = g.querySelector("text"), full = g.getAttribute("data-label");
    var n = Math.floor((w - 6) / CHAR);
    t.textContent = n < 3 ? "" : (full.length <= n ? full : full.slice(0, n - 2) + "..");
  }
  function zoom(target) {
    var x0 = num(target, "x"), w0 = num(target, "w"), d0 = num(target, "d");
    var scale = (W - 2 * PAD) / w0;
    frames.forEach(function (g) {
      var x = num(g, "x"), w = num(g, "w"), d = num(g, "d");
      var inside = x >= x0 - 1e-9 && x + w <= x0 + w0 + 1e-9;
      var ancestor = d < d0 && x <= x0 + 1e-9 && x + w >= x0 + w0 - 1e-9;
      var r = g.querySelector("rect"), t = g.querySelector("text");
      if (!inside && !ancestor) { g.style.display = "none"; return; }
      g.style.display = "";
      var nx = inside ? PAD + (x - x0) * scale : PAD;
      var nw = inside ? w * scale : W - 2 * PAD;
      r.setAttribute("x", nx); r.setAttribute("width", Math.max(nw - 0.5, 0.1));
      t.setAttribute("x", nx + 3);
      g.style.opacity = ancestor ? 0.6 : 1;
      fit(g, nw);
    });
    zoomLabel.style.display = (target === frames[0]) ? "none" : "";
  }
  frames.forEach(function (g) {
    g.addEventListener("click", function () { zoom(g); });
    g.addEventListener("mouseover", function () {
      details.textContent = g.getAttribute("data-label") + "  (" + g.getAttribute("data-info") + ")";
    });
    g.addEventListener("mouseout", function () { details.textContent = " "; });
  });
  zoomLabel.addEventListener("click", function () { zoom(frames[0]); });
  document.getElementById("fg-search").addEventListener("click", function () {
    var term = window.prompt("Search frames (regular expression):", "");
    var total = num(frames[0], "n"), hit = 0, covered = [];
    frames.forEach(function (g) {
      g.querySelector("rect").setAttribute("fill", g.getAttribute("data-fill"));
    });
    if (!term) { matchedLabel.textContent = " "; return; }
    var re;
    try { re = new RegExp(term); } catch (e) { matchedLabel.textContent = "bad expression"; return; }
    frames.forEach(function (g) {
      if (!re.test(g.getAttribute("data-label"))) return;
      g.querySelector("rect").setAttribute("fill", "rgb(230,0,230)");
      var x = num(g, "x"), w = num(g, "w");
      if (!covered.some(function (c) { return x >= c[0] && x + w <= c[1] + 1e-9; })) {
        covered.push([x, x + w]); hit += num(g, "n");
      }
    });
    matchedLabel.textContent = "Matched: " + (100 * hit / total).toFixed(2) + "%%";
  });
})();
"""


def _frame_rows(root: Node, min_fraction: float) -> tuple[list[str], int]:
    """One ``<g class="fr">`` per drawn node (depth first) and the deepest depth drawn; nodes
    narrower than ``min_fraction`` of the root are left out."""
    total = max(root.samples, 1)
    usable = WIDTH - 20
    rows: list[str] = []
    max_depth = 0

    def emit(node: Node, x: float, depth: int) -> None:
        nonlocal max_depth
        max_depth = max(max_depth, depth)
        frac = node.samples / total
        width = frac * usable
        px = 10 + x * usable
        y = TOP + depth * ROW
        fill = _color(node)
        info = f"{node.samples} samples, {frac * 100:.2f}%"
        label = node.label
        rows.append(
            f'<g class="fr" data-label="{_esc(label)}" data-info="{info}" data-fill="{fill}" '
            f'data-x="{x:.9f}" data-w="{frac:.9f}" data-d="{depth}" data-n="{node.samples}">'
            f"<title>{_esc(label)} ({info})</title>"
            f'<rect x="{px:.2f}" y="{y}" width="{max(width - 0.5, 0.1):.2f}" height="{ROW - 1}" '
            f'fill="{fill}" rx="2" ry="2"/>'
            f'<text x="{px + 3:.2f}" y="{y + 12}">{_esc(_fit(label, width))}</text></g>'
        )
        child_x = x
        for child in sorted(node.children.values(), key=lambda c: c.label):
            if child.samples / total >= min_fraction:
                emit(child, child_x, depth + 1)
            child_x += child.samples / total

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))
    try:
        emit(root, 0.0, 0)
    finally:
        sys.setrecursionlimit(limit)
    return rows, max_depth


def render_svg(root: Node, title: str, min_fraction: float = 0.0002, for_html: bool = False) -> str:
    """The flamegraph as SVG markup; nodes narrower than ``min_fraction`` of the root are merged
    into their parent (py-spy/inferno prune the same way) to keep files small."""
    rows, max_depth = _frame_rows(root, min_fraction)
    height = TOP + (max_depth + 1) * ROW + 10
    script = _SCRIPT % {"width": WIDTH, "char": repr(FONT_CHAR_PX)}
    head = "" if for_html else '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
    parts = [
        head,
        f'<svg id="fg-root" version="1.1" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        'xmlns="http://www.w3.org/2000/svg">',
        "<style>text{font-family:DejaVu Sans Mono,Menlo,Consolas,monospace;font-size:12px;fill:#000}"
        "g.fr{cursor:pointer}g.fr:hover rect{stroke:#000;stroke-width:0.6}"
        ".ctl{cursor:pointer;fill:#1f4fa8}#fg-title{font-size:16px;font-family:sans-serif}</style>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fdfdf5"/>',
        f'<text id="fg-title" x="{WIDTH / 2}" y="22" text-anchor="middle">{_esc(title)}</text>',
        '<text id="fg-unzoom" class="ctl" x="10" y="22" style="display:none">Reset zoom</text>',
        f'<text id="fg-search" class="ctl" x="{WIDTH - 10}" y="22" text-anchor="end">Search</text>',
        f'<text id="fg-matched" x="{WIDTH - 10}" y="{TOP - 6}" text-anchor="end"> </text>',
        f'<text id="fg-details" x="10" y="{TOP - 6}"> </text>',
        *rows,
    ]
    if not for_html:
        parts.append(f'<script type="text/ecmascript"><![CDATA[{script}]]></script>')
    parts.append("</svg>\n")
    return "\n".join(parts)


def render_html(root: Node, title: str, min_fraction: float = 0.0002) -> str:
    """The flamegraph as a standalone HTML page (the SVG inline, the script once)."""
    svg = render_svg(root, title, min_fraction, for_html=True)
    script = _SCRIPT % {"width": WIDTH, "char": repr(FONT_CHAR_PX)}
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{_esc(title)}</title>"
        "<style>body{margin:0;background:#fdfdf5}</style></head><body>\n"
        f"{svg}<script>{script}</script>\n</body></html>\n"
    )


def write_flamegraph(stacks: Iterable[Stack], output: str, title: str) -> int:
    """Write an ``.svg`` or ``.html`` flamegraph atomically; returns the number of samples."""
    root = build_tree(stacks, root_label="all")
    root.label = f"all ({root.samples} samples)"
    is_html = output.lower().endswith((".html", ".htm"))
    text = render_html(root, title) if is_html else render_svg(root, title)
    write_text_atomically(output, text)
    return root.samples
