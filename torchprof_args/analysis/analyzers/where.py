"""Where each rank is: the ranks' stacks files merged with what the flight recorder says.

Each rank's stacks file (``stacks_rank<R>.json``, :mod:`torchprof_args.shared.stacks_file`) gives the main
thread's innermost frames (where the exception that ended the loop was raised, else the live
stack); the flight recorder, when there is one, gives each rank's last collective and the
collective it never issued.  Ranks whose innermost frames match form one group; the smallest
group (the odd one out) comes first: "ranks 0-6, 8-15: all_reduce at train.py:88; rank 7:
loader.py:41 in __next__, never issued the all_reduce".  Works with stacks alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torchprof_args.shared.stacks_file import frame_text, load_stacks, main_frames, signature, user_frames

__all__ = ["find_stacks", "format_where", "where_ranks_are"]

_STACKS_RE = re.compile(r"^stacks_rank(\d+)\.json$")
#: Frames shown per group (innermost first).
SHOWN_FRAMES = 6


def find_stacks(directory: str | Path) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """``({rank: stacks record}, problems)`` of the stacks files in ``directory`` (a file that is
    not one is a problem, said, not an error)."""
    found: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    for entry in sorted(Path(directory).iterdir()):
        match = _STACKS_RE.match(entry.name)
        if not match or not entry.is_file():
            continue
        try:
            found[int(match.group(1))] = load_stacks(entry)
        except ValueError as err:
            problems.append(str(err))
    return found, problems


def _collective_notes(recorders: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per rank: its last recorded collective and, from the findings, what it never issued or waits in."""
    notes: dict[int, dict[str, Any]] = {}
    for recorder in recorders:
        for rank, view in (recorder.get("last") or {}).items():
            notes.setdefault(int(rank), {})["last_collective"] = view
        for finding in recorder.get("findings", []):
            what = f"{finding['collective']} #{finding['seq']}"
            for rank in finding["missing_ranks"]:
                notes.setdefault(rank, {})["never_issued"] = what
            for rank in finding["joined"]:
                notes.setdefault(rank, {})["waits_in"] = what
    return notes


def _rank_view(record: dict[str, Any], note: dict[str, Any]) -> dict[str, Any]:
    frames, source = main_frames(record)
    app = user_frames(frames)
    return {"where": frame_text(frames[0]) if frames else "no Python frame",
            "called_from": frame_text(app[0]) if app and app[0] is not frames[0] else None,
            "code": frames[0].get("code", "") if frames else "", "source": source,
            "frames": [frame_text(f, full_path=True) for f in frames[:SHOWN_FRAMES]],
            "reason": record.get("reason"), "host": record.get("host"), "pid": record.get("pid"),
            "threads": [t.get("name") for t in record.get("threads", [])],
            "native": (record.get("native") or {}).get("status"),
            "native_text": (record.get("native") or {}).get("text", ""), **note}


def _groups(stacks: dict[int, dict[str, Any]], ranks: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    by_signature: dict[tuple[str, ...], list[int]] = {}
    for rank, record in sorted(stacks.items()):
        by_signature.setdefault(signature(record), []).append(rank)
    groups = []
    for members in by_signature.values():
        first = ranks[members[0]]
        collectives = {r: _collective_text(ranks[r]) for r in members}
        groups.append({"ranks": members, "where": first["where"], "called_from": first["called_from"],
                       "code": first["code"], "frames": first["frames"],
                       "collective": collectives[members[0]] if len(set(collectives.values())) == 1 else None,
                       "collectives": collectives})
    groups.sort(key=lambda g: (len(g["ranks"]), g["ranks"][0]))  # the odd one out first
    return groups


def _collective_text(view: dict[str, Any]) -> str | None:
    if view.get("never_issued"):
        return f"never issued {view['never_issued']}"
    if view.get("waits_in"):
        return f"waits in {view['waits_in']}"
    last = view.get("last_collective")
    if last:
        return f"last collective {last['collective']} #{last['seq']} ({last.get('state')})"
    return None


def where_ranks_are(stacks: dict[int, dict[str, Any]], recorders: list[dict[str, Any]] | None = None,
                    world_size: int | None = None) -> dict[str, Any]:
    """The merged answer as plain data: per rank, groups (odd one first), ranks without stacks."""
    notes = _collective_notes(recorders or [])
    ranks = {rank: _rank_view(record, notes.get(rank, {})) for rank, record in sorted(stacks.items())}
    known = max([world_size or 0, *(r + 1 for r in stacks), *(r + 1 for r in notes)])
    return {"ranks": ranks, "groups": _groups(stacks, ranks),
            "missing": [r for r in range(known) if r not in stacks]}


def _span(ranks: list[int]) -> str:
    """``0-6, 8-15``: runs of consecutive ranks."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


MISSING_AT_HANG = "not dumped: killed, crashed, or started without --torch-profile-stacks"


def format_where(answer: dict[str, Any], frames: int = 4, missing: str = MISSING_AT_HANG) -> list[str]:
    """The text lines: one per group (odd one first), its innermost frames, then ranks without stacks."""
    lines = []
    for group in answer["groups"]:
        members = group["ranks"]
        head = f"rank{'s' if len(members) > 1 else ''} {_span(members)}: {group['where']}"
        head += f", called from {group['called_from']}" if group["called_from"] else ""
        if group["collective"]:
            head += f"; {group['collective']}"
        lines.append(head)
        if group["code"]:
            lines.append(f"      > {group['code']}")
        lines += [f"      {frame}" for frame in group["frames"][:frames]]
        if not group["collective"]:
            lines += [f"      rank {r}: {text}" for r, text in group["collectives"].items() if text]
    if answer["missing"]:
        plural = "s" if len(answer["missing"]) > 1 else ""
        lines.append(f"no stacks from rank{plural} {_span(answer['missing'])} ({missing})")
    return lines
