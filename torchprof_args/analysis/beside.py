"""What the run wrote beside a cycle's traces: the step timers' ``metrics.jsonl``
(:mod:`.diagnose.step_timers`), a framework's tokens per expert (:mod:`.diagnose.expert_tokens`), the
compiled-modules file (:mod:`.analyzers.compiled.kernel_modules`).

Looked for in the traces' folder or up to two folders above (a cycle folder, its run, the profile
directory), never outside ``torchprof mcp``'s roots, and read as a best effort: a flag that names
the file instead is told why it cannot be read, here it is passed over (a caller may collect why:
``read_beside``'s ``problems``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from torchprof_args.naming import cycle_of_name

__all__ = ["find_beside", "read_beside", "traced_cycle"]

_Read = TypeVar("_Read")

#: the traces' folder and the two above it.
_LEVELS = 3


def find_beside(traces: Sequence[Path], within: Sequence[str] | None,
                found: Callable[[Path], Path | None]) -> Path | None:
    """The first ``found(folder)`` that is not None, from the traces' folder up.

    Args:
        traces: the cycle's trace files.
        within: folders (real paths) the file must lie under (``torchprof mcp``'s roots); None: any.
        found: what a folder holds of what is looked for (None: nothing).
    """
    for trace in traces[:1]:
        for folder in list(trace.resolve().parents)[:_LEVELS]:
            if within is not None and not any(folder.is_relative_to(root) for root in within):
                break
            if (hit := found(folder)) is not None:
                return hit
    return None


def read_beside(traces: Sequence[Path], within: Sequence[str] | None, found: Callable[[Path], Path | None],
                read: Callable[[Path, Sequence[Path]], _Read | None],
                problems: list[str] | None = None) -> _Read | None:
    """``read(path, traces)`` of what :func:`find_beside` finds; None where nothing is found or it
    cannot be read (OSError, ValueError: the reason appended to ``problems`` when given)."""
    path = find_beside(traces, within, found)
    if path is None:
        return None
    try:
        return read(path, traces)
    except (OSError, ValueError) as err:
        if problems is not None:
            problems.append(str(err) if isinstance(err, ValueError) else f"{path}: {err.strerror or err}")
        return None


def traced_cycle(traces: Sequence[Path]) -> tuple[int, int] | None:
    """The iterations the traces' cycle covers, from their folder's name, else their file's."""
    for trace in traces[:1]:
        return cycle_of_name(trace.parent.name, folder=True) or cycle_of_name(trace.name, folder=False)
    return None
