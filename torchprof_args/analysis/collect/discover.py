"""Which traces a command was given, and which profiled cycle each belongs to.

Every trace command accepts trace files, a cycle folder (``iter000120-000121/``, one trace per
rank) or a run folder (the profile directory: one cycle folder per profiled cycle, or, in the
flat layout of older runs and other tools, the traces themselves).  Summaries in ``summaries/``
folders, hidden files (traces still being published) and anything that is not a trace are
skipped.

Ranks are only comparable within one cycle, so the cross-rank view, the report and the diff
work per :class:`Cycle`: the traces of one cycle folder, of one ``_iterA-B`` name suffix in a flat
folder, or of one folder of traces from another tool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torchprof_args.errors import TraceError
from torchprof_args.naming import SUMMARIES_SUBDIR, TRACE_FILE_SUFFIXES, TRACE_SUFFIX, cycle_of_name

__all__ = ["Cycle", "choose_cycle", "expand", "group_by_cycle", "traces_in"]


def traces_in(directory: Path) -> list[Path]:
    """The traces directly in ``directory`` (sorted; not raising when there are none).

    torch.profiler's ``*.pt.trace.json[.gz]`` files when there are any (a run folder also holds
    other JSON, e.g. wandb's), else every ``.json`` / ``.json.gz`` file.  Hidden files are skipped.
    """
    candidates = sorted(
        p for p in directory.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.name.endswith(TRACE_FILE_SUFFIXES)
    )
    return [p for p in candidates if TRACE_SUFFIX in p.name] or candidates


def _holds_profiler_traces(directory: Path) -> bool:
    try:
        return any(TRACE_SUFFIX in p.name and not p.name.startswith(".") for p in directory.iterdir())
    except OSError:
        return False


def _in_folder(directory: Path) -> list[Path]:
    """A folder's traces: its own, then those of its cycle folders (one level, sorted).

    When cycle folders hold traces, other JSON directly in the folder (``wandb_run.json``...) is
    not taken for a trace: only ``*.pt.trace.json[.gz]`` files there count.
    """
    nested: list[Path] = []
    for sub in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if sub.name == SUMMARIES_SUBDIR or sub.name.endswith(".split"):  # summaries; `torchprof split` pieces
            continue
        if cycle_of_name(sub.name, folder=True) is not None or _holds_profiler_traces(sub):
            nested += traces_in(sub)
    own = traces_in(directory)
    if nested:
        own = [p for p in own if TRACE_SUFFIX in p.name]
    return own + nested


def expand(inputs: list[str | Path]) -> list[Path]:
    """The trace files named directly or found in run / cycle folders, in order, without repeats.

    Args:
        inputs: trace files, cycle folders (``iter000120-000121/``) or run folders.

    Returns:
        The trace files.

    Raises:
        TraceError: a path that does not exist, or a folder without traces.
    """
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = _in_folder(path)
            if not found:
                raise TraceError(f"{path}: no .json or .json.gz trace files in this folder or its cycle "
                                 "folders")
            files += found
        elif not path.exists():
            raise TraceError(f"{path}: no such file or directory")
        else:
            files.append(path)
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


@dataclass
class Cycle:
    """The traces of one profiled cycle (or of one folder of traces without cycle information)."""

    label: str
    iterations: tuple[int, int] | None
    files: list[Path] = field(default_factory=list)


def cycle_key(path: Path) -> tuple[str, tuple[int, int] | None]:
    """(label, iterations) of the cycle ``path`` belongs to."""
    folder = path.parent
    found = cycle_of_name(folder.name, folder=True)
    if found is not None:
        return str(folder), found
    found = cycle_of_name(path.name, folder=False)
    if found is not None:
        return f"{folder}/*_iter{found[0]:06d}-{found[1]:06d}", found
    return str(folder), None


def group_by_cycle(files: list[Path]) -> list[Cycle]:
    """Trace files grouped by profiled cycle.

    Args:
        files: trace files (:func:`expand`'s).

    Returns:
        The cycles in iteration order (then by label), each with its files in input order.
    """
    cycles: dict[str, Cycle] = {}
    for f in files:
        label, iterations = cycle_key(f)
        cycles.setdefault(label, Cycle(label, iterations)).files.append(f)
    return sorted(cycles.values(), key=lambda c: (c.iterations is None, c.iterations or (0, 0), c.label))


def choose_cycle(files: list[Path], cycle: int | None) -> tuple[list[Path], str | None]:
    """The files of one cycle: cycle folders (``iter000120-000121/``), or the ``_iterA-B`` suffix of the
    flat layout's file names.

    Args:
        files: trace files (:func:`expand`'s).
        cycle: the cycle's first iteration (None: the latest).

    Returns:
        Its files and its label (``iterations A-B``; None when the files name no cycle).

    Raises:
        TraceError: no cycle starts at ``cycle`` (the message lists those that do).
    """
    cycles = group_by_cycle(files)
    named = [(c, c.iterations) for c in cycles if c.iterations is not None]
    if cycle is not None:
        chosen = [(c, (first, last)) for c, (first, last) in named if first == cycle]
        if not chosen:
            known = (", ".join(str(first) for _, (first, _) in named)
                     or "none (no iter<first>-<last> folders or names)")
            raise TraceError(f"--cycle {cycle}: no traces of a cycle starting at iteration {cycle} "
                             f"(cycles: {known})")
        found, (first, last) = chosen[0]
        return found.files, f"iterations {first}-{last}"
    if len(cycles) <= 1:
        key = cycles[0].iterations if cycles else None
        return files, (f"iterations {key[0]}-{key[1]}" if key else None)
    latest = named[-1][0] if named else cycles[-1]
    span = f"iterations {latest.iterations[0]}-{latest.iterations[1]}" if latest.iterations else latest.label
    note = f"{span} (the latest of {len(cycles)} cycles here; --cycle FIRST_ITERATION picks another)"
    return latest.files, note
