"""The text of ``torchprof collectives``: the ranks by the waiting they caused, the collectives
with the worst arrival skew and a table per collective type, for
:func:`~torchprof_args.analysis.tools.collectives.collectives_report`'s result."""

from __future__ import annotations

from torchprof_args.analysis.analyzers.collective_match import CollectiveInstance, CycleCollectives

__all__ = ["format_collectives"]


def _ms(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us / 1e3:.3f} ms" if us < 1e5 else f"{us / 1e6:.3f} s"


def _size(nbytes: int | None) -> str:
    if not nbytes:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(nbytes)


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _what(inst: CollectiveInstance) -> str:
    if inst["pg"] is not None:
        where = f" pg {inst['pg']}"
        if inst.get("pg_desc") not in (None, "undefined"):
            where += f" ({inst['pg_desc']})"
    else:
        where = f" {inst['channel']}" if inst["channel"].startswith("stream") else ""
    if inst["seq"] is not None:
        number = f" seq {inst['seq']}"
    else:
        number = f" #{inst['order']}" if inst["order"] is not None else ""
    return f"{inst['kind']}{number}{where}"


def _header(report: CycleCollectives) -> list[str]:
    ranks, world = report["ranks"], report["world_size"]
    groups = report["process_groups"]
    head = f"torchprof collectives: {len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    head += (f" of {world}" if world else "") + f", {report['collective_count']} collectives"
    if groups:
        head += f" in {len(groups)} process group{'s' if len(groups) != 1 else ''}"
    if report.get("cycle"):
        head += f", {report['cycle']}"
    lines = [head]
    lines.append(f"  events:     {report['source'] or 'no collectives found'}")
    lines.append(f"  matched by: {report['matched_by']}")
    lines.append(f"  clock:      {report['clock'].text()}")
    lines += [f"  note:       {note}" for note in report["notes"]]
    return lines


def _ranks_table(report: CycleCollectives, rows: int) -> list[str]:
    total = report["wait_caused_total_us"]
    lines = ["", f"Ranks by the waiting they caused (arrived last while others waited; total {_ms(total)})",
             f"  {'rank':>5} {'last arrivals':>14} {'waiting caused':>15} {'share':>7} {'late (sum)':>12} "
             f"{'waited for others':>18}"]
    for row in report["ranks_by_wait_caused"][:rows]:
        lines.append(f"  {row['rank']:>5} {row['last_arrivals']:>6}/{row['collectives']:<7} "
                     f"{_ms(row['wait_caused_us']):>15} {row['wait_caused_pct']:>6.1f}% "
                     f"{_ms(row['late_us']):>12} {_ms(row['waited_us']):>18}")
    return lines


def _worst_table(report: CycleCollectives, rows: int) -> list[str]:
    instances = report["instances"]
    lines = ["", "Collectives with the worst arrival skew",
             f"  {'step':<18} {'collective':<34} {'size':>10} {'skew':>12} {'last':>5} "
             f"{'duration min..max':>24} {'algbw':>7} {'busbw GB/s':>10}"]
    for index in report["worst_skew"][:rows]:
        inst = instances[index]
        durations = f"{_ms(inst['dur_min_us'])}..{_ms(inst['dur_max_us'])}"
        lines.append(f"  {inst['step']:<18} {_what(inst)[:34]:<34} {_size(inst['bytes']):>10} "
                     f"{_ms(inst['skew_us']):>12} {inst['last_rank']:>5} {durations:>24} "
                     f"{_gbps(inst['algbw_gbps']):>7} "
                     f"{_gbps(inst['busbw_gbps']):>10}")
    if not report["worst_skew"]:
        lines.append("  (no collective seen by two or more ranks)")
    return lines


def _types_table(report: CycleCollectives, rows: int) -> list[str]:
    lines = ["", "By collective type",
             f"  {'collective':<16} {'pg':<6} {'count':>6} {'total size':>11} {'time (last arrival)':>20} "
             f"{'skew mean':>11} {'skew max':>11} {'busbw median':>13}"]
    for row in report["by_type"][:rows]:
        lines.append(f"  {row['kind']:<16} {str(row['pg']):<6} {row['count']:>6} {_size(row['bytes']):>11} "
                     f"{_ms(row['transfer_us']):>20} {_ms(row['skew_mean_us']):>11} "
                     f"{_ms(row['skew_max_us']):>11} {_gbps(row['busbw_median_gbps']):>13}")
    return lines


def _traffic_table(report: CycleCollectives, rows: int) -> list[str]:
    traffic = report.get("all_to_all_by_rank") or []
    if not traffic:
        return []
    count = sum(1 for i in report["instances"] if i["bytes_by_rank"])
    lines = ["", f"Variable-size all-to-all ({count} instances whose ranks moved different amounts: MoE "
                 "dispatch and combine), bytes per rank",
             f"  {'rank':>5} {'sent':>11} {'received':>11} {'sent + received / mean':>23}"]
    for row in traffic[:rows]:
        lines.append(f"  {row['rank']:>5} {_size(row['sent_bytes']):>11} {_size(row['received_bytes']):>11} "
                     f"{row['traffic_vs_mean']:>22.2f}x")
    return lines


def format_collectives(report: CycleCollectives, rows: int = 10) -> str:
    """The text ``torchprof collectives`` prints: how instances were matched, the ranks by the waiting
    they caused, the worst skews, a table per collective type, each rank's bytes in the variable-size
    all-to-alls.

    Args:
        report: :func:`~torchprof_args.analysis.tools.collectives.collectives_report`'s result.
        rows: rows per table.

    Returns:
        The text, without a final newline.
    """
    lines = _header(report)
    if report["collective_count"]:
        lines += (_ranks_table(report, rows) + _worst_table(report, rows) + _types_table(report, rows)
                  + _traffic_table(report, rows))
    return "\n".join(lines)
