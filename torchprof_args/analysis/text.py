"""Plain-text renderings of summaries: ``profiler_list.dat`` table and ``torchprof summary``."""

from __future__ import annotations

from typing import Any


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.3f}s"
    if value >= 1e3:
        return f"{value / 1e3:.3f}ms"
    return f"{value:.3f}us"


def _bytes(value: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.2f} {unit}" if unit != "B" else f"{value} B"
        value /= 1024
    return str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}%"


def _cut(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _steps_lines(summary: dict[str, Any]) -> list[str]:
    steps = summary.get("steps") or []
    if not steps:
        return ["Steps: no ProfilerStep annotations in this trace"]
    lines = [f"Steps ({len(steps)}, mean {_us(summary.get('step_mean_us'))}):"]
    lines += [f"  {s['name']:<24} {_us(s['dur_us']):>14}" for s in steps]
    return lines


def _memory_lines(summary: dict[str, Any]) -> list[str]:
    mem = summary.get("memory") or []
    if not mem:
        return ["Memory: no [memory] events (record with profile_memory=True)"]
    lines = ["Memory (from [memory] events):", f"  {'device':<10} {'peak allocated':>16} {'peak reserved':>16} {'samples':>9}"]
    for m in mem:
        lines.append(
            f"  {m['device']:<10} {_bytes(m['peak_allocated_bytes']):>16} "
            f"{_bytes(m['peak_reserved_bytes']):>16} {m['samples']:>9}"
        )
    return lines


def format_profiler_list(summary: dict[str, Any], rows: int = 30) -> str:
    """A ``profiler_list.dat``-style table from :func:`summarize`'s result.

    Step durations first, then the top operators sorted by device (kernel) time, or by CPU time
    when the trace has no kernels, then peak memory per device.
    """
    has_device = summary.get("gpu") is not None and bool(summary.get("top_ops_by_device"))
    ops = summary.get("top_ops_by_device") if has_device else summary.get("top_cpu_ops")
    ops = (ops or [])[:rows]
    rank = summary.get("rank")
    head = f"Trace: {summary.get('file')}" + (f" (rank {rank} of {summary.get('world_size')})" if rank is not None else "")
    lines = [head, ""]
    lines += _steps_lines(summary)
    lines.append("")
    sort_key = "device total" if has_device else "CPU total"
    lines.append(f"Top {len(ops)} operators by {sort_key}:")
    width = 60
    cols = f"{'Name':<{width}} {'Calls':>8} {'Self CPU total':>15} {'CPU total':>15}"
    if has_device:
        cols += f" {'Self device total':>18} {'Device total':>15}"
    lines += [cols, "-" * len(cols)]
    for op in ops:
        line = (
            f"{_cut(op['name'], width):<{width}} {op['calls']:>8} {_us(op['self_cpu_us']):>15} {_us(op['cpu_total_us']):>15}"
        )
        if has_device:
            line += f" {_us(op['self_device_us']):>18} {_us(op['device_total_us']):>15}"
        lines.append(line)
    if not ops:
        lines.append("(no CPU operators in this trace)")
    lines.append("")
    lines += _memory_lines(summary)
    return "\n".join(lines) + "\n"


def format_summary(summary: dict[str, Any], rows: int = 10) -> str:
    """Human-readable ``torchprof summary`` output for one trace."""
    rank = summary.get("rank")
    lines = [
        f"== {summary['file']}",
        f"rank {rank if rank is not None else '?'} of {summary.get('world_size') or '?'}"
        f" ({summary.get('backend') or 'no distributedInfo'}), {summary['events']:,} events,"
        f" {summary['uncompressed_bytes'] / 1e6:,.1f} MB of JSON",
    ]
    lines += _steps_lines(summary)
    gpu = summary.get("gpu")
    if gpu is not None:
        kt = gpu["kernel_type_us"]
        lines += [
            f"GPU (HTA definitions; {gpu['kernels']:,} kernels on streams {gpu['streams']}"
            + (", last ProfilerStep excluded" if gpu["last_step_excluded"] else "")
            + "):",
            f"  kernel-active span {_us(gpu['kernel_active_span_us'])}: idle {_pct(gpu['idle_pct'])},"
            f" compute {_pct(gpu['compute_pct'])}, non-compute {_pct(gpu['non_compute_pct'])}",
            f"  computation {_us(kt['computation'])}, communication {_us(kt['communication'])},"
            f" memory {_us(kt['memory'])} (exclusive)",
        ]
        for name, value in gpu["kernel_type_overlapping_us"].items():
            lines.append(f"  {name}: {_us(value)}")
        lines.append(f"  communication/computation overlap: {_pct(gpu['comm_comp_overlap_pct'])}")
        lines.append(f"Top {min(rows, len(summary['top_kernels']))} GPU kernels by total time:")
        for k in summary["top_kernels"][:rows]:
            lines.append(f"  {_us(k['total_us']):>12} {k['pct']:6.2f}% {k['calls']:>7}x {k['type']:<13} {_cut(k['name'], 90)}")
    else:
        cpu = summary.get("cpu")
        lines.append("GPU: no kernels in this trace (CPU-only view)")
        if cpu:
            lines.append(f"CPU threads over a {_us(cpu['span_us'])} span:")
            for t in cpu["threads"][:rows]:
                lines.append(f"  pid {t['pid']} tid {t['tid']}: busy {_us(t['busy_us'])} ({_pct(t['busy_pct'])})")
    for title, key, field in (
        ("Top CPU operators by total time", "top_cpu_ops", "cpu_total_us"),
        ("Top CPU operators by self time", "top_cpu_ops_by_self", "self_cpu_us"),
    ):
        ops = summary.get(key) or []
        lines.append(f"{title}:")
        for op in ops[:rows]:
            lines.append(f"  {_us(op[field]):>12} {op['calls']:>7}x {_cut(op['name'], 90)}")
    lines += _memory_lines(summary)
    return "\n".join(lines) + "\n"


def format_cross_rank(view: dict[str, Any]) -> str:
    """Human-readable cross-rank view (one row per rank, then the slowest/fastest rank)."""
    lines = ["== cross-rank view", f"  {'rank':>5} {'steps':>6} {'mean step':>12} {'GPU idle':>9} {'overlap':>8}"]
    for r in sorted(view["ranks"], key=lambda r: r["rank"]):
        lines.append(
            f"  {r['rank']:>5} {r['steps']:>6} {_us(r['step_mean_us']):>12} {_pct(r['idle_pct']):>9} "
            f"{_pct(r['comm_comp_overlap_pct']):>8}"
        )
    if view.get("slowest_rank") is not None:
        lines.append(
            f"  slowest rank {view['slowest_rank']}, fastest rank {view['fastest_rank']},"
            f" spread {view['spread_pct']:.2f}% of the mean step ({_us(view['step_mean_us'])})"
        )
    return "\n".join(lines) + "\n"
