"""``torchprof mem``'s renderings of a memory report (its ``--json`` document as a dict): the text
output, the timeline as an inline SVG (stacked by category) and the HTML report's memory section."""

from __future__ import annotations

import html
from typing import Any

from torchprof_args.analysis.memory.categories import human_bytes

__all__ = ["MEMORY_COLORS", "format_memory_report", "memory_section", "timeline_svg"]

MEMORY_COLORS = {"parameter": "#2e7d32", "gradient": "#1f4e9c", "optimizer_state": "#d4a017",
                   "activation": "#c62828", "temporary": "#8e6fc1", "other": "#9e9e9e"}


def _mib(n: float | None) -> str:
    return human_bytes(n)


def _categories(values: dict[str, int]) -> str:
    total = sum(values.values()) or 1
    return ", ".join(f"{name.replace('_', ' ')} {_mib(v)} ({100 * v / total:.0f}%)"
                     for name, v in sorted(values.items(), key=lambda kv: -kv[1]) if v)


def _when(when: dict[str, Any]) -> str:
    bits = [when["phase"]]
    if when.get("step"):
        bits.append(f"{when['step']} +{when['ms_into_step']:.1f} ms")
    if when.get("op"):
        bits.append(when["op"])
    if when.get("module"):
        bits.append(f"module {when['module']}")
    if when.get("site"):
        bits.append(f"at {when['site']}")
    return ", ".join(bits)


def _peak_lines(doc: dict[str, Any]) -> list[str]:
    peak = doc["peak"]
    if peak is None:
        return ["No [memory] events in the traces: record them with --torch-profile-profile-memory (and "
                "--torch-profile-record-shapes --torch-profile-with-stack for PyTorch's own categories)."]
    who = f"rank {peak['rank']} " if peak["rank"] is not None else ""
    lines = [f"Peak: {_mib(peak['bytes'])} on {who}{peak['device']} ({_when(peak['when'])})",
             f"  held by: {_categories(peak['by_category'])}",
             f"  categories from {'PyTorch' if peak['source'] == 'pytorch' else 'the trace'}"
             + "".join(f"; {n}" for n in peak["notes"][:3])]
    for site in peak["top_sites"][:5]:
        lines.append(f"  {_mib(site['bytes']):>12}  {site['category']:<15} {site['site']}")
    return lines


def _oom_lines(oom: dict[str, Any] | None) -> list[str]:
    if oom is None:
        return []
    lines = ["", f"OOM: {oom['summary']}", f"  held then: {_categories(oom['held'])}",
             f"  failed request from {oom['site']}"]
    if oom["remedy"] is not None:
        lines.append(f"  remedy: {oom['remedy']['remedy']} (frees {_mib(oom['remedy']['bytes_freed'])})")
    else:
        frees = [f"{r['kind']} {_mib(r['bytes_freed'])}" for r in oom["remedies"][1:] if r["bytes_freed"]]
        lines.append("  no single change frees the missing bytes: " + "; ".join(frees))
    return lines


def format_memory_report(doc: dict[str, Any], rows: int = 10) -> str:
    """The text output of ``torchprof mem`` (at most about 40 lines)."""
    head = f"== {doc['path']}" + (f" ({doc['cycle']})" if doc.get("cycle") else "")
    lines = [head, *(_peak_lines(doc) if doc["ranks"] or not doc["snapshots"] else [])]
    if len(doc["ranks"]) > 1:
        peaks = sorted(doc["ranks"], key=lambda r: -r["peak_bytes"])
        low, high = _mib(peaks[-1]["peak_bytes"]), _mib(peaks[0]["peak_bytes"])
        lines.append(f"Ranks: {len(peaks)}, peaks {low} .. {high}")
    lines += [f"Outlier: {o['summary']}" for o in doc["outliers"][:5]]
    if doc.get("allocator"):
        lines.append(f"metrics.jsonl: {doc['allocator']['summary']}")
    for snap in doc["snapshots"]:
        for d in snap["devices"]:
            lines.append(f"Snapshot {snap['path']}: cuda:{d['device']} reserved {_mib(d['reserved_bytes'])}, "
                         f"allocated {_mib(d['allocated_bytes'])}, cached free "
                         f"{_mib(d['cached_free_bytes'])} (largest block "
                         f"{_mib(d['largest_free_block_bytes'])}, fragmentation "
                         f"{d['fragmentation_pct']:.0f}%), {d['history_events']} history events")
    lines += _oom_lines(doc["oom"])
    if doc["findings"]:
        lines += ["", "What would free memory (largest first):"]
        for i, f in enumerate(doc["findings"][:rows], 1):
            ranks = f" [ranks {', '.join(map(str, f['ranks'][:8]))}]" if f["ranks"] else ""
            lines += [f"{i}. {f['kind']}: {_mib(f['bytes_freed'])}{ranks}: {f['summary']}",
                      f"   -> {f['remedy']}"]
    lines += [f"error: {e}" for e in doc["errors"]]
    return "\n".join(lines) + "\n"


def timeline_svg(timeline: dict[str, Any], title: str, width: int = 760, height: int = 220) -> str:
    """Live bytes by category over the window, stacked (inline SVG, a tooltip per category)."""
    t = timeline["t_ms"]
    series = [(name, timeline["by_category"][name]) for name in MEMORY_COLORS
              if any(timeline["by_category"][name])]
    if len(t) < 2 or not series:
        return ""
    left, top, plot_w, plot_h = 70, 24, width - 190, height - 54
    span = max(t[-1] - t[0], 1e-9)
    totals = [sum(values[i] for _, values in series) for i in range(len(t))]
    vmax = max(max(totals), 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">',
           f'<text x="4" y="14" font-weight="bold">{html.escape(title)}</text>']
    base = [0] * len(t)
    for name, values in series:
        upper = [b + v for b, v in zip(base, values, strict=True)]
        xs = [left + plot_w * (x - t[0]) / span for x in t]
        top_pts = " ".join(f"{x:.1f},{top + plot_h * (1 - u / vmax):.1f}"
                           for x, u in zip(xs, upper, strict=True))
        low_pts = " ".join(f"{x:.1f},{top + plot_h * (1 - b / vmax):.1f}"
                           for x, b in zip(reversed(xs), reversed(base), strict=True))
        out.append(f'<polygon points="{top_pts} {low_pts}" fill="{MEMORY_COLORS[name]}" '
                   f'fill-opacity="0.85"><title>{html.escape(name)}: up to {_mib(max(values))}</title>'
                   '</polygon>')
        base = upper
    out.append(f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_mib(vmax)}</text>'
               f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>'
               f'<text x="{left}" y="{top + plot_h + 14}">0 ms</text>'
               f'<text x="{left + plot_w}" y="{top + plot_h + 14}" text-anchor="end">{span:,.1f} ms</text>')
    for i, (name, _) in enumerate(series):
        y = top + 14 * i
        out.append(f'<rect x="{left + plot_w + 12}" y="{y}" width="10" height="10" '
                   f'fill="{MEMORY_COLORS[name]}"/><text x="{left + plot_w + 26}" y="{y + 9}">'
                   f'{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def memory_section(doc: dict[str, Any] | None) -> str:
    """The HTML report's memory section of one cycle (empty without ``[memory]`` events)."""
    if doc is None or doc["peak"] is None:
        return ""
    peak = doc["peak"]
    parts = ["<h3>Memory (torchprof mem)</h3>",
             f"<p>Peak {html.escape(_mib(peak['bytes']))} on rank {peak['rank']} "
             f"{html.escape(peak['device'])}: {html.escape(_when(peak['when']))}. Held by "
             f"{html.escape(_categories(peak['by_category']))}.</p>"]
    if doc["timeline"]:
        parts.append(timeline_svg(doc["timeline"], f"Live memory by category, rank {peak['rank']}"))
    if doc["outliers"]:
        items = "".join(f"<li>{html.escape(o['summary'])}</li>" for o in doc["outliers"][:8])
        parts.append(f"<ul>{items}</ul>")
    if doc["findings"]:
        rows = "".join(f"<tr><td>{i}</td><td>{html.escape(f['kind'])}</td><td class=num>"
                       f"{html.escape(_mib(f['bytes_freed']))}</td><td>{html.escape(f['summary'])}</td>"
                       f"<td>{html.escape(f['remedy'])}</td></tr>"
                       for i, f in enumerate(doc["findings"][:8], 1))
        parts.append("<table><tr><th>#</th><th>kind</th><th>frees</th><th>finding</th><th>remedy</th></tr>"
                     f"{rows}</table>")
    return "\n".join(parts)
