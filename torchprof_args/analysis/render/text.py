"""Plain-text renderings of summaries: a trace's operator table (the ``profiler_list.dat`` layout),
``torchprof summary`` (one trace) and the cross-rank view of a cycle."""

from __future__ import annotations

from collections.abc import Callable

from torchprof_args.analysis.analyzers.fsdp import FSDP2_STEP_PHASES, FSDP_PHASES
from torchprof_args.analysis.analyzers.step_work import WORK_IN_WORDS
from torchprof_args.analysis.summary import CrossRankView, Summary
from torchprof_args.analysis.summary.cross_rank import Distribution, RankRow
from torchprof_args.shared.stragglers import describe

__all__ = ["compiled_lines", "fmt_pct", "fmt_us", "format_cross_rank", "format_operator_table",
           "format_profiler_list", "format_summary"]


def fmt_us(value: float | None) -> str:
    """Microseconds as us, ms or s with three decimals; ``-`` for None."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.3f}s"
    if value >= 1e3:
        return f"{value / 1e3:.3f}ms"
    return f"{value:.3f}us"


def _bytes(value: int) -> str:
    if abs(value) < 1024:
        return f"{value} B"
    size = value / 1024
    for unit in ("KiB", "MiB"):
        if abs(size) < 1024:
            return f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} GiB"


def fmt_pct(value: float | None) -> str:
    """A percentage with two decimals; ``-`` for None."""
    return "-" if value is None else f"{value:.2f}%"


def _cut(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _steps_lines(summary: Summary) -> list[str]:
    steps = summary.steps
    if not steps:
        return ["Steps: no ProfilerStep annotations in this trace"]
    lines = [f"Steps ({len(steps)}, mean {fmt_us(summary.step_mean_us)}):"]
    lines += [f"  {s.name:<24} {fmt_us(s.dur_us):>14}" for s in steps]
    return lines


def _memory_lines(summary: Summary) -> list[str]:
    mem = summary.memory
    if not mem:
        return ["Memory: no [memory] events (record with profile_memory=True)"]
    lines = ["Memory (from [memory] events):",
             f"  {'device':<10} {'peak allocated':>16} {'peak reserved':>16} {'samples':>9}"]
    for m in mem:
        lines.append(
            f"  {m.device:<10} {_bytes(m.peak_allocated_bytes):>16} "
            f"{_bytes(m.peak_reserved_bytes):>16} {m.samples:>9}"
        )
    if any(m.device == "cpu" for m in mem):
        lines.append("  cpu: what was allocated while recording only (the CPU allocator's totals in a "
                     "trace); `torchprof mem` adds the memory held from before the window (parameters, "
                     "optimizer state), so its cpu peak is larger")
    return lines


def format_operator_table(summary: Summary, rows: int = 30) -> str:
    """The operator table (``profiler_list.dat`` layout) of a trace's summary.

    Args:
        summary: :func:`~torchprof_args.analysis.summary.summarize`'s result.
        rows: operators to list at most.

    Returns:
        The text: step durations, then the top operators by device (kernel) time, or by CPU time
        when the trace has no kernels, then peak memory per device.
    """
    has_device = summary.gpu is not None and bool(summary.top_ops_by_device)
    ops = (summary.top_ops_by_device if has_device else summary.top_cpu_ops)[:rows]
    rank = summary.rank
    head = f"Trace: {summary.file}"
    if rank is not None:
        head += f" (rank {rank} of {summary.world_size})"
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
            f"{_cut(op.name, width):<{width}} {op.calls:>8} {fmt_us(op.self_cpu_us):>15}"
            f" {fmt_us(op.cpu_total_us):>15}"
        )
        if has_device:
            line += f" {fmt_us(op.self_device_us):>18} {fmt_us(op.device_total_us):>15}"
        lines.append(line)
    if not ops:
        lines.append("(no CPU operators in this trace)")
    lines.append("")
    lines += _memory_lines(summary)
    return "\n".join(lines) + "\n"


#: The old name of :func:`format_operator_table`, kept for scripts that import it (it was public).
format_profiler_list = format_operator_table


def format_summary(summary: Summary, rows: int = 10) -> str:
    """Human-readable ``torchprof summary`` output for one trace.

    Args:
        summary: the trace's summary.
        rows: rows per table at most.

    Returns:
        The text, ending in a newline.
    """
    rank = summary.rank
    lines = [
        f"== {summary.file}",
        f"rank {rank if rank is not None else '?'} of {summary.world_size or '?'}"
        f" ({summary.backend or 'no distributedInfo'}), {summary.events:,} events,"
        f" {summary.uncompressed_bytes / 1e6:,.1f} MB of JSON",
    ]
    lines += _steps_lines(summary)
    gpu = summary.gpu
    if gpu is not None:
        kt = gpu.kernel_type_us
        lines += [
            f"GPU (HTA definitions; {gpu.kernels:,} kernels on streams {gpu.streams}"
            + (", last ProfilerStep excluded" if gpu.last_step_excluded else "")
            + "):",
            f"  kernel-active span {fmt_us(gpu.kernel_active_span_us)}: idle {fmt_pct(gpu.idle_pct)},"
            f" compute {fmt_pct(gpu.compute_pct)}, non-compute {fmt_pct(gpu.non_compute_pct)}",
            f"  computation {fmt_us(kt['computation'])}, communication {fmt_us(kt['communication'])},"
            f" memory {fmt_us(kt['memory'])} (exclusive)",
        ]
        for name, value in gpu.kernel_type_overlapping_us.items():
            lines.append(f"  {name}: {fmt_us(value)}")
        lines.append(f"  communication/computation overlap: {fmt_pct(gpu.comm_comp_overlap_pct)}")
        lines.append(f"Top {min(rows, len(summary.top_kernels))} GPU kernels by total time:")
        for k in summary.top_kernels[:rows]:
            lines.append(f"  {fmt_us(k.total_us):>12} {k.pct:6.2f}% {k.calls:>7}x {k.type:<13} "
                         f"{_cut(k.name, 90)}")
    else:
        cpu = summary.cpu
        lines.append("GPU: no kernels in this trace (CPU-only view)")
        if cpu:
            lines.append(f"CPU threads over a {fmt_us(cpu.span_us)} span:")
            for t in cpu.threads[:rows]:
                lines.append(f"  pid {t.pid} tid {t.tid}: busy {fmt_us(t.busy_us)} ({fmt_pct(t.busy_pct)})")
    for title, ops, by_self in (("Top CPU operators by total time", summary.top_cpu_ops, False),
                                ("Top CPU operators by self time", summary.top_cpu_ops_by_self, True)):
        lines.append(f"{title}:")
        for op in ops[:rows]:
            time = op.self_cpu_us if by_self else op.cpu_total_us
            lines.append(f"  {fmt_us(time):>12} {op.calls:>7}x {_cut(op.name, 90)}")
    lines += _fsdp_lines(summary)
    lines += compiled_lines(summary)
    lines += _memory_lines(summary)
    return "\n".join(lines) + "\n"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def compiled_lines(summary: Summary, rows: int = 10) -> list[str]:
    """The compiled regions with the modules they ran for, and the Triton kernels on the roofline
    (nothing for a trace without compiled code)."""
    code = summary.compiled
    if code is None:
        return []
    lines = []
    if code.regions:
        lines.append("Compiled code per step (torch.compile; what each call ran for: the module around it):")
        for r in code.regions[:rows]:
            modules = ", ".join(r.modules[:4]) + (" ..." if len(r.modules) > 4 else "")
            lines.append(f"  {fmt_us(r.ms_per_step * 1e3):>12} {r.calls:>5}x {_cut(r.name, 70):<70} "
                         f"[{modules}]")
        if any("?" in r.modules for r in code.regions):
            lines.append("  ?: no module or frame around the call: record with --torch-profile-with-stack "
                         "and --torch-profile-with-modules")
    if code.kernels:
        peaks = (f"{code.device}: {_num(code.peak_tflops, 1)} TFLOP/s bf16, {_num(code.peak_tbps, 2)} TB/s"
                 if code.device else "no GPU name in the trace")
        share = code.inductor_flop_share
        covered = "" if share is None else f"; inductor's FLOPs cover {fmt_pct(100 * share)} of kernel time"
        lines.append(f"Triton kernels on the roofline (inductor's kernel_flop / kernel_num_gb; "
                     f"{peaks}{covered}):")
        lines.append(f"  {'ms/step':>9} {'calls':>6} {'GFLOP':>8} {'GB':>8} {'TFLOP/s':>8} {'TB/s':>6} "
                     f"{'bound':>7} {'of roof':>7}  kernel [modules]")
        for k in code.kernels[:rows]:
            modules = ", ".join(k.modules[:3]) + (" ..." if len(k.modules) > 3 else "")
            roof = fmt_pct(100 * k.of_roof) if k.of_roof is not None else "-"
            lines.append(f"  {k.ms_per_step:>9.3f} {k.calls:>6} {_num(k.gflop, 3):>8} {_num(k.gb, 4):>8} "
                         f"{_num(k.tflops, 1):>8} {_num(k.tbps, 2):>6} {k.bound or '-':>7} {roof:>7}  "
                         f"{_cut(k.name, 60)} [{modules}]")
    if code.modules:
        lines.append(f"Kernels of compiled code per step by the module they came from (inductor's "
                     f"provenance, {code.module_map}):")
        for m in code.modules[:rows]:
            lines.append(f"  {fmt_us(m.ms_per_step * 1e3):>12} {m.calls:>5}x {_cut(m.module, 40):<40} "
                         f"[{', '.join(m.kernels[:3])}{' ...' if len(m.kernels) > 3 else ''}]")
    elif code.module_map is not None:
        lines.append(f"Kernels of compiled code: no module map ({code.module_map})")
    return lines


def _fsdp_lines(summary: Summary) -> list[str]:
    """FSDP2's phases per step (nothing for a model that is not ``fully_shard``-ed)."""
    if not summary.fsdp:
        return []
    lines: list[str] = []
    split = summary.fsdp_step
    if split is not None:
        lines.append(f"Step by FSDP2 phase (the innermost annotation open; they add up to the "
                     f"{fmt_us(split.step_ms * 1e3)} step):")
        for name, ms in split.by_phase.items():
            share = 100 * ms / split.step_ms if split.step_ms > 0 else 0.0
            lines.append(f"  {fmt_us(ms * 1e3):>12} {share:5.1f} %  {name:<15} {FSDP2_STEP_PHASES[name]}")
    lines += ["FSDP2 annotations per step (nested: pre_forward holds an all-gather it waits for; "
              "not additive):"]
    for p in summary.fsdp:
        modules = ", ".join(p.modules[:3]) + (" ..." if len(p.modules) > 3 else "")
        lines.append(f"  {fmt_us(p.ms_per_step * 1e3):>12} {p.calls:>5}x {p.phase:<28} "
                     f"{FSDP_PHASES.get(p.phase, '')}" + (f" [{modules}]" if modules else ""))
    return lines


def _coords(row: RankRow, axes: list[str]) -> str:
    par = row.parallel or {}
    return " ".join(f"{par[a]:>3}" if a in par else "  -" for a in axes)


def _rank_table(rows: list[RankRow], axes: list[str]) -> list[str]:
    hosts = max([len(r.host or "-") for r in rows] + [4])
    head = f"    {'rank':>5} {'host':<{hosts}} " + " ".join(f"{a:>3}" for a in axes)
    head += f" {'steps':>5} {'mean step':>11} {'work':>11} {'score':>8} {'GPU idle':>9} {'overlap':>8}  file"
    lines = [head]
    for r in rows:
        vs = "-" if r.straggler_score is None else f"{r.straggler_score:.2f}x"
        lines.append(
            f"    {r.rank:>5} {(r.host or '-'):<{hosts}} " + _coords(r, axes)
            + f" {r.steps:>5} {fmt_us(r.step_mean_us):>11} {fmt_us(r.work_mean_us):>11} {vs:>8} "
            f"{fmt_pct(r.idle_pct):>9} "
            f"{fmt_pct(r.comm_comp_overlap_pct):>8}  {r.file.rsplit('/', 1)[-1]}"
        )
    return lines


def _fsdp_table(rows: list[RankRow]) -> list[str]:
    """Each rank's mean step by FSDP2 phase (nothing when no rank is ``fully_shard``-ed)."""
    split = [r for r in rows if r.fsdp_step is not None]
    if not split:
        return []
    names = list(FSDP2_STEP_PHASES)
    lines = ["  step by FSDP2 phase (ms per step; they add up to the step):",
             f"    {'rank':>5} " + " ".join(f"{n:>14}" for n in names) + f" {'step':>10}"]
    for r in split:
        assert r.fsdp_step is not None
        by = r.fsdp_step.by_phase
        lines.append(f"    {r.rank:>5} " + " ".join(f"{by.get(n, 0.0):>14.2f}" for n in names)
                     + f" {r.fsdp_step.step_ms:>10.2f}")
    return lines


def _distribution_line(label: str, d: Distribution, fmt: Callable[[float | None], str]) -> list[str]:
    if not d.n:
        return []
    return [f"  {label:<18} " + " ".join(f"{fmt(q):>10}" for q in (d.min, d.p50, d.p90, d.max))]


def format_cross_rank(view: CrossRankView, title: str = "", all_ranks: bool = False) -> str:
    """Human-readable cross-rank view of one cycle.

    Args:
        view: :func:`~torchprof_args.analysis.summary.cross_rank`'s result.
        title: the cycle's name.
        all_ranks: a line per rank; otherwise every rank only when there are few, else the
            slowest and fastest.

    Returns:
        The text: the distributions over ranks, the spread and stragglers, the ranks' table.
    """
    rows = view.ranks
    dist = view.distributions
    lines = [f"== cross-rank view{': ' + title if title else ''} ({len(rows)} rank(s))"]
    lines.append(f"  {'':<18} {'min':>10} {'p50':>10} {'p90':>10} {'max':>10}")
    lines += _distribution_line("step time", dist.step_mean_us, fmt_us)
    lines += _distribution_line("GPU idle", dist.idle_pct, fmt_pct)
    lines += _distribution_line("comm/comp overlap", dist.comm_comp_overlap_pct, fmt_pct)
    if view.slowest_rank is not None:
        lines.append(
            f"  slowest rank {view.slowest_rank}, fastest rank {view.fastest_rank} (by work per step),"
            f" spread {view.spread_pct:.2f}% of the mean step ({fmt_us(view.step_mean_us)})"
        )
        n = len(view.stragglers)
        rule = describe(WORK_IN_WORDS, view.straggler_threshold, view.straggler_min_ms)
        lines.append(f"  stragglers ({rule}): "
                     + (f"{n}, rank(s) " + ", ".join(str(r.rank) for r in view.stragglers[:20])
                        + (" ..." if n > 20 else "") if n else "none"))
    axes = [a for a in ("dp", "tp", "pp", "cp", "ep") if any(a in (r.parallel or {}) for r in rows)]
    k = len(view.slowest)
    if all_ranks or len(rows) <= 2 * k:
        lines.append("  every rank:")
        lines += _rank_table(rows, axes)
    else:
        lines.append(f"  {k} slowest ranks:")
        lines += _rank_table(view.slowest, axes)
        lines.append(f"  {k} fastest ranks:")
        lines += _rank_table(view.fastest, axes)
        lines.append(f"  ({len(rows) - 2 * k} more; --all-ranks lists every rank)")
    shown = rows if all_ranks or len(rows) <= 2 * k else [*view.slowest, *view.fastest]
    lines += _fsdp_table(shown)
    return "\n".join(lines) + "\n"
