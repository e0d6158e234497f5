"""The ``torchprof pyspy report`` table: where the samples landed, and which of your frames led there.

One row per distinct stack (or per distinct leaf and library frame with
``aggregate_leaf_paths``): the leaf is the deepest frame, where the time was spent; the library
frame is the deepest frame of your own code (files outside site-packages and the standard
library) or of ``--library-name``, the code you can change.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from torchprof_args.analysis.pyspy.parse import UNKNOWN, Frame, Profile, is_own_code, shorten_path

__all__ = [
    "COLUMNS", "ReportRow", "format_report", "format_table", "in_library", "report_document", "report_rows",
]


def in_library(path: str | None, library: str) -> bool:
    """Whether ``path`` is inside ``library`` (``megatron``, ``megatron.core``, ``megatron/core``,
    or a single module such as ``train``)."""
    if not path:
        return False
    wanted = [p for p in re.split(r"[./\\]", library) if p]
    parts = [p for p in re.split(r"[/\\]", path) if p]
    if parts and parts[-1].endswith(".py"):
        parts[-1] = parts[-1][:-3]
    n = len(wanted)
    return any(parts[i : i + n] == wanted for i in range(len(parts) - n + 1))


@dataclasses.dataclass
class ReportRow:
    """One row of the table: the leaf frame, the library frame that led there, the samples."""

    name: str
    path: str
    line: int | None
    library_function_name: str
    library_function_path: str
    library_function_line: int | None
    samples: int
    proportion: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _leaf(frames: Sequence[Frame]) -> Frame | None:
    for frame in reversed(frames):
        if not frame.is_context:
            return frame
    return None


def _library_frame(frames: Sequence[Frame], library: str | None) -> Frame | None:
    for frame in reversed(frames):
        if frame.is_context or frame.kind == UNKNOWN:
            continue
        if (in_library(frame.path, library) if library else is_own_code(frame.path)):
            return frame
    return None


#: A frame as the report shows it: name, path, line.
_Described = tuple[str, str, int | None]


def _describe(frame: Frame | None) -> _Described:
    if frame is None:
        return "(no Python frames)", "-", None
    if frame.kind == UNKNOWN or frame.path is None:
        return frame.name, "-", None
    return frame.name, shorten_path(frame.path), frame.line


def report_rows(
    profile: Profile,
    library: str | None = None,
    aggregate_leaf_paths: bool = False,
    top: int | None = 20,
) -> list[ReportRow]:
    """The report table: one row per distinct stack, or per distinct (leaf, library frame)
    with ``aggregate_leaf_paths``; sorted by samples, largest first."""
    total = profile.total_samples
    #: (leaf, library frame, the whole stack unless aggregated) -> samples
    grouped: Counter[tuple[_Described, _Described, tuple[Frame, ...]]] = Counter()
    for stack in profile.stacks:
        leaf = _describe(_leaf(stack.frames))
        lib = _describe(_library_frame(stack.frames, library))
        if lib[0] == "(no Python frames)":
            lib = ("-", "-", None)
        grouped[leaf, lib, () if aggregate_leaf_paths else stack.frames] += stack.count
    rows = [
        ReportRow(*leaf, *lib, samples=count, proportion=(count / total if total else 0.0))
        for (leaf, lib, _), count in grouped.most_common()
    ]
    rows.sort(key=lambda r: (-r.samples, r.name, r.path))
    return rows[:top] if top else rows


COLUMNS = (
    "name",
    "path",
    "line",
    "library_function_name",
    "library_function_path",
    "library_function_line",
    "proportion (n)",
)


def _cells(row: ReportRow) -> list[str]:
    def line(value: int | None) -> str:
        return "-" if value is None else str(value)

    return [
        row.name,
        row.path,
        line(row.line),
        row.library_function_name,
        row.library_function_path,
        line(row.library_function_line),
        f"{row.proportion * 100:.2f}% ({row.samples})",
    ]


def format_table(rows: Iterable[ReportRow], max_width: int = 60) -> str:
    """The seed's pipe table; long cells are cut in the middle to ``max_width``."""

    def cut(text: str) -> str:
        text = " ".join(text.split())
        if len(text) <= max_width:
            return text
        half = (max_width - 3) // 2
        return text[:half] + "..." + text[-(max_width - 3 - half) :]

    body = [[cut(c) for c in _cells(r)] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(COLUMNS)]
    numeric = {2, 5, 6}

    def fmt(cells: Sequence[str]) -> str:
        out = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return " " + " | ".join(out)

    lines = [fmt(COLUMNS), "-" + "-+-".join("-" * w for w in widths) + "-"]
    lines += [fmt(r) for r in body]
    return "\n".join(lines)


def report_document(profile: Profile, rows: Sequence[ReportRow], *, library: str | None,
                    aggregate_leaf_paths: bool) -> dict[str, Any]:
    """What ``torchprof pyspy report --json`` prints: the files, the counts and the rows."""
    return {
        "files": profile.files,
        "total_samples": profile.total_samples,
        "library_name": library,
        "aggregate_leaf_paths": aggregate_leaf_paths,
        "unparsed_frames": profile.unparsed_frames,
        "unparsed_frame_samples": profile.unparsed_frame_samples,
        "malformed_records": profile.malformed_records,
        "rows": [row.as_dict() for row in rows],
    }


def format_report(profile: Profile, rows: Iterable[ReportRow], *, library: str | None) -> str:
    """What ``torchprof pyspy report`` prints: the table (or why there is none), the sample count and
    a note per thing that could not be read."""
    if profile.total_samples == 0:
        lines = [f"No samples in {', '.join(profile.files)} (was the program shorter than one sampling "
                 "interval, or only idle without --idle?)."]
    else:
        lines = [format_table(rows), "", f"{profile.total_samples} samples in {len(profile.files)} file(s); "
                 f"library frames: {library or 'your own code'}."]
    return "\n".join(lines + [f"Note: {note}" for note in profile.problems()])
