"""One clock per host in ``torchprof hang``: the flight recorder's times put on the reference host's clock
(:func:`dump_clocks`), and the timeline they give, when each rank issued its last collective
(:func:`last_issued`).

A dump's times (``time_created_ns``, ``time_discovered_completed_ns``) are its host's wall clock, off
from the other hosts' by NTP's error.  The same estimator as the traces' aligns them
(:func:`~torchprof_args.analysis.analyzers.clocks.clocks_from_moments`): per collective every rank
waits in, matched across ranks by its process group and sequence number, each rank's completion is a
reading of one moment (its creation, an arrival: no rank completes before the last was created).
NCCL's recorder discovers completions (its watchdog, lazily: the spread of the readings shows it);
gloo's records none, so there the reading is the rank's next record's creation on the same thread,
read like a step boundary after a collective: no causality bound (an asynchronous collective, waited
for later, has its next record issued before it completed: a bound from it would be false, and its
reading an outlier the medians leave out), known within the least time a rank spent from its arrival
to its next record (the last arrival's transfer and its work before issuing the next, clock-free).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment
from torchprof_args.analysis.analyzers.clocks import (
    BASIS_FLIGHT_RECORDER,
    EVERY_RANK_WAITS,
    UNKNOWN_HOST,
    SharedMoment,
    alignment,
    clocks_from_moments,
    unaligned,
)
from torchprof_args.analysis.analyzers.collectives import canonical_kind

__all__ = ["dump_clocks", "last_issued"]


def _left_at(entries: list[dict[str, Any]], i: int, completions: bool) -> float | None:
    """When the rank left entry ``i`` (ns): its completion, else its thread's next record's creation."""
    entry = entries[i]
    if completions:
        return entry.get("time_discovered_completed_ns")
    if not entry.get("retired") and entry.get("state") != "completed":
        return None
    later = (e for e in entries[i + 1:] if e.get("thread_id") == entry.get("thread_id"))
    following = next(later, None)
    return following.get("time_created_ns") if following is not None else None


def _moments(dumps: dict[int, dict[str, Any]]) -> list[SharedMoment]:
    """Every collective every rank waits in, matched by (process group, sequence number) on two or more
    ranks, as the ranks' clocks read its end."""
    found: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for rank, dump in dumps.items():
        for i, entry in enumerate(dump["entries"]):
            kind = canonical_kind(str(entry.get("profiling_name")))
            if not entry.get("is_p2p") and kind in EVERY_RANK_WAITS:
                found[(str(entry["process_group"][0]), entry["collective_seq_id"])][rank] = i
    completions = all(e.get("time_discovered_completed_ns") for d in dumps.values() for e in d["entries"]
                      if e.get("retired") or e.get("state") == "completed")
    out = []
    for where in found.values():
        ends: dict[int, float] = {}
        arrivals: dict[int, float] = {}
        for rank, i in where.items():
            entries = dumps[rank]["entries"]
            left = _left_at(entries, i, completions)
            if left is not None and entries[i].get("time_created_ns") is not None:
                ends[rank], arrivals[rank] = left / 1e3, entries[i]["time_created_ns"] / 1e3
        if len(ends) < 2 or len(ends) < len(where):
            continue
        if completions:
            out.append(SharedMoment(ends, arrivals))
        else:  # like a step boundary: no bound, known within the least time a rank spent to its next record
            out.append(SharedMoment(ends, precision_us=min(ends[r] - arrivals[r] for r in ends)))
    return out


def dump_clocks(dumps: dict[int, dict[str, Any]], infos: dict[int, dict[str, Any]]) -> ClockAlignment:
    """The hosts' clocks of one recorder's dumps (``clock`` in ``torchprof hang --json``).

    Args:
        dumps: rank -> its dump (plain data).
        infos: rank -> its ``dump_info_rank<R>.json`` (its ``host``).

    Returns:
        The :class:`ClockAlignment` (``basis`` "flight recorder"); not aligned, with the reason, on one
        host, where a dump's host is not recorded, or where a host shares fewer than
        :data:`~torchprof_args.analysis.analyzers.clocks.MIN_SHARED` completed collectives.
    """
    hosts: dict[str, list[int]] = defaultdict(list)
    for rank in sorted(dumps):
        hosts[str(infos.get(rank, {}).get("host") or UNKNOWN_HOST)].append(rank)
    if len(hosts) < 2 or UNKNOWN_HOST in hosts:
        return unaligned(hosts, "some dumps do not say their host (no dump_info): their clocks taken as one")
    clocks, shared = clocks_from_moments(_moments(dumps), dict(hosts))
    return alignment(clocks, shared, BASIS_FLIGHT_RECORDER, too_few="completed flight-recorder collectives")


def last_issued(dumps: dict[int, dict[str, Any]], clock: ClockAlignment) -> dict[int, float]:
    """Per rank, when it issued its last recorded collective (s, on the reference clock where aligned),
    before the last rank's: 0 for the rank that issued last, the rank that went quiet first the most
    negative."""
    issued = {}
    for rank, dump in dumps.items():
        created = [e["time_created_ns"] / 1e3 for e in dump["entries"] if e.get("time_created_ns")]
        if created:
            issued[rank] = created[-1] + clock.offset_us(rank, created[-1])
    latest = max(issued.values(), default=0.0)
    return {rank: (t - latest) / 1e6 for rank, t in sorted(issued.items())}
