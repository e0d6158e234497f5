"""The flag table of the documentation (``docs/reference/flags.md``), generated from the registry.

:mod:`torchprof_args.commands.docs_reference` writes the page; a test regenerates it and compares.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable

from torchprof_args.capture.flags.registry import Flag, FlagGroup

__all__ = ["flag_table_markdown"]

_CODE_SPAN = re.compile(r"(`[^`]*`)")


def _text(text: str) -> str:
    """``text`` for a markdown table cell: ``<`` and ``>`` outside code spans escaped (an
    unescaped ``<profile dir>`` would be read as an HTML tag and vanish), ``|`` escaped."""
    parts = _CODE_SPAN.split(text)
    for index in range(0, len(parts), 2):
        parts[index] = parts[index].replace("<", "&lt;").replace(">", "&gt;")
    return "".join(parts).replace("|", "\\|")


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
    return f"| `{option}` | {_text(flag.default_text())} | {_text(meaning)} |"


def flag_table_markdown(groups: Iterable[FlagGroup], *, heading: str | None = None) -> str:
    """One markdown table per group: flag, default, meaning.  Each group opens with
    ``**title**: description``, or with a ``heading`` line (e.g. ``"##"``) holding the title."""
    lines: list[str] = []
    for group in groups:
        if heading:
            lines += [f"{heading} {group.title}", "", _text(group.description), ""]
        else:
            lines += [f"**{group.title}**: {_text(group.description)}", ""]
        lines += ["| flag | default | meaning |", "|---|---|---|"]
        lines += [_row(flag) for flag in group.flags]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
