"""The README's flag table, generated from the registry (a test keeps the README in sync)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from torchprof_args.flags.registry import Flag, FlagGroup

__all__ = ["BEGIN_MARKER", "END_MARKER", "flag_table_markdown", "replace_flag_table"]

BEGIN_MARKER = "<!-- BEGIN FLAG TABLE -->"
END_MARKER = "<!-- END FLAG TABLE -->"


def _row(flag: Flag) -> str:
    option = flag.option
    if flag.action is argparse.BooleanOptionalAction:
        option = f"{option}, --no-{flag.option[2:]}"
    elif flag.metavar:
        option += f" {flag.metavar}" + (f" [{flag.metavar} ...]" if flag.nargs == "+" else "")
    meaning = flag.help
    if flag.choices:
        meaning += f" Choices: {', '.join(map(str, flag.choices))}."
    if flag.host_owned:
        meaning += " Reused if the host parser defines it."
    return f"| `{option}` | {flag.default_text()} | {meaning} |"


def flag_table_markdown(groups: Iterable[FlagGroup]) -> str:
    """One markdown table per group: flag, default, meaning."""
    lines: list[str] = []
    for group in groups:
        lines += [f"**{group.title}**: {group.description}", "",
                  "| flag | default | meaning |", "|---|---|---|"]
        lines += [_row(flag) for flag in group.flags]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def replace_flag_table(readme: str, table: str) -> str:
    """``readme`` with the text between the FLAG TABLE markers replaced by ``table``."""
    head, rest = readme.split(BEGIN_MARKER, 1)
    _, tail = rest.split(END_MARKER, 1)
    return f"{head}{BEGIN_MARKER}\n{table}{END_MARKER}{tail}"
