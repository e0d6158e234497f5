"""Collectives across ranks: each instance matched on every rank, who arrived last, who waited.

Matching uses the strongest key every trace records:

1. process group + sequence number (the ``Seq`` PyTorch records on NCCL collectives);
2. else the order within each process group and ProfilerStep;
3. else (no process group recorded) the order on each NCCL stream within each ProfilerStep (one
   stream per communicator), or, on the CPU, the order of each collective type within each step.

An order is the order issued where the trace gives it (gloo: each run's c10d operator on the
training thread, :attr:`~.collectives.CommRecord.issued_us`; its worker threads may start two
queued runs out of order), else the order of the starts.  Orders are aligned, not just counted:
each rank's sequence is aligned to the longest one on (collective type, message size where it must
be the same on every rank), so a record one rank lacks (a sampled trace) leaves it unmatched
instead of shifting everything after it.

The fallbacks are said in the result (``matched_by``), and an instance whose ranks recorded
different collective types is counted in the notes: that is what a wrong fallback looks like.

Per instance: the arrival skew (last start minus first), the rank that arrived last, each rank's
duration (which includes its wait), the transfer time (the last arrival's duration: it waited for
nobody), algorithm bandwidth ``S / t`` and bus bandwidth with the nccl-tests factors (all-reduce
``2(n-1)/n``; all-gather, reduce-scatter, all-to-all ``(n-1)/n``; broadcast, reduce, p2p 1).
Then the ranks by the waiting they caused (the sum, over the instances where a rank arrived last,
of how long each other rank waited for it) and the instances with the worst skew.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, TypedDict

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment
from torchprof_args.analysis.analyzers.collectives import GPU_CHANNEL, P2P_KINDS, CommRecord, RankComms

__all__ = [
    "MATCH_KIND_ORDER", "MATCH_PG_ORDER", "MATCH_SEQ", "MATCH_STREAM_ORDER", "CollectiveInstance",
    "SAME_SIZE_KINDS", "CollectivesReport", "CycleCollectives", "RankWait", "TypeTotal", "bus_factor",
    "experts_side", "match_collectives",
]

MATCH_SEQ = "process group and sequence number"
MATCH_PG_ORDER = "order within each process group and ProfilerStep (the traces record no sequence numbers)"
MATCH_STREAM_ORDER = ("order on each NCCL stream within each ProfilerStep (the traces record neither process "
                      "group nor sequence number; a communicator's stream stands in for its process group)")
MATCH_KIND_ORDER = ("order of each collective type within each ProfilerStep (the traces record neither "
                    "process group nor sequence number)")


class CollectiveInstance(TypedDict):
    """One collective matched across ranks (``torchprof collectives --json``'s ``instances``; times in
    us on the ranks' trace clocks, ranks as keys)."""

    id: int
    kind: str
    pg: str | None
    pg_desc: str | None
    seq: int | None
    step: str
    channel: str
    #: its position in its channel when the traces record no sequence number (else None).
    order: int | None
    #: no counterpart on the other ranks: listed, not compared.
    unmatched: bool
    ranks: int
    missing_ranks: list[int]
    group_size: int | None
    group_size_assumed: bool
    bytes: int | None
    bytes_assumed: bool
    dtype: str | None
    algorithm: str | None
    protocol: str | None
    first_start_us: float
    skew_us: float
    first_rank: int
    last_rank: int
    arrival_offset_us: dict[int, float]
    dur_us: dict[int, float]
    dur_min_us: float
    dur_max_us: float
    #: the last arrival's duration: it waited for nobody.
    transfer_us: float
    algbw_gbps: float | None
    busbw_gbps: float | None
    #: how long the other ranks waited for the last one, summed.
    wait_caused_us: float
    #: each rank's collective type, when they differ (a wrong fallback looks like this).
    kinds_differ: dict[int, str] | None
    #: a variable-size all-to-all's ``[sent, received]`` bytes per rank (None: the ranks' sizes are
    #: equal, or not known); ``bytes`` is then the heaviest rank's larger direction.
    bytes_by_rank: dict[int, list[int]] | None


class RankWait(TypedDict):
    """One rank: the collectives it joined, how often it arrived last, the waiting it caused (and
    its share), how late it was and how long it waited for others, summed (us)."""

    rank: int
    collectives: int
    last_arrivals: int
    wait_caused_us: float
    waited_us: float
    late_us: float
    wait_caused_pct: float


class TypeTotal(TypedDict):
    """One collective type on one process group: count, bytes, skew, time and bus bandwidth."""

    kind: str
    pg: str
    count: int
    bytes: int
    skew_mean_us: float
    skew_max_us: float
    transfer_us: float
    busbw_median_gbps: float | None


class RankTraffic(TypedDict):
    """One rank's bytes in the variable-size all-to-alls of a cycle (MoE token dispatch and combine):
    sent and received, summed, and their sum against the ranks' mean (the load on the rank's links:
    in a token dispatch the rank whose experts get the most tokens receives the most, and sends
    the most back in the combine)."""

    rank: int
    sent_bytes: int
    received_bytes: int
    traffic_vs_mean: float


class CollectivesReport(TypedDict):
    """:func:`match_collectives`' result: ``torchprof collectives --json`` (with ``cycle``)."""

    ranks: list[int]
    world_size: int | None
    files: dict[int, str]
    source: str | None
    matched_by: str
    collective_count: int
    process_groups: list[str]
    wait_caused_total_us: float
    ranks_by_wait_caused: list[RankWait]
    #: the ``id`` of the instances with the worst skew, worst first.
    worst_skew: list[int]
    by_type: list[TypeTotal]
    #: per rank, its bytes in the variable-size all-to-alls, the most traffic first (empty: none).
    all_to_all_by_rank: list[RankTraffic]
    notes: list[str]
    instances: list[CollectiveInstance]


class CycleCollectives(CollectivesReport):
    """The report of one cycle's traces (``torchprof collectives --json``), with which cycle it is
    (``iterations A-B``; None for files outside a cycle folder) and the hosts' clocks (every time
    on the first rank's host's clock when aligned)."""

    cycle: str | None
    clock: ClockAlignment


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor for a collective over ``n`` ranks."""
    if n <= 1:
        return 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _mode(ranks: Sequence[RankComms]) -> str:
    records = [r for rc in ranks for r in rc.records]
    if records and all(r.pg is not None and r.seq is not None for r in records):
        return MATCH_SEQ
    if records and all(r.pg is not None for r in records):
        return MATCH_PG_ORDER
    if records and all(r.channel.startswith(GPU_CHANNEL) for r in records):
        return MATCH_STREAM_ORDER
    return MATCH_KIND_ORDER


def _stream_names(ranks: Sequence[RankComms]) -> tuple[dict[int, dict[str, str]], bool]:
    """Each rank's stream -> channel name: the stream itself when every rank uses the same streams,
    else the streams' order of first use (``NCCL stream #k``)."""
    sets = {rc.rank: {r.channel for r in rc.records} for rc in ranks}
    same = len({frozenset(s) for s in sets.values() if s}) <= 1
    names: dict[int, dict[str, str]] = {}
    for rc in ranks:
        order = list(dict.fromkeys(r.channel for r in rc.records))
        names[rc.rank] = {c: c if same else f"NCCL stream #{i}" for i, c in enumerate(order)}
    return names, same


#: Collectives whose message size is the same on every rank: part of their signature when aligning.
SAME_SIZE_KINDS = frozenset({"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier"})


def _signature(record: CommRecord) -> tuple[str, int | None]:
    return record.kind, record.nbytes if record.kind in SAME_SIZE_KINDS else None


def _channel(record: CommRecord, mode: str, streams: dict[str, str]) -> tuple[Any, ...]:
    if mode == MATCH_PG_ORDER:
        return record.step, record.pg, record.kind in P2P_KINDS
    if mode == MATCH_STREAM_ORDER:
        return record.step, streams.get(record.channel, record.channel)
    return record.step, record.kind


def _seq_keys(ranks: Sequence[RankComms]) -> dict[int, list[tuple[tuple[Any, ...], CommRecord]]]:
    return {rc.rank: [((r.pg, r.kind in P2P_KINDS, r.seq), r) for r in rc.records] for rc in ranks}


def _aligned_keys(ranks: Sequence[RankComms], mode: str, streams: dict[int, dict[str, str]]
                  ) -> dict[int, list[tuple[tuple[Any, ...], CommRecord]]]:
    """Keys by position within each channel, each rank's sequence aligned to the longest one on
    (type, size) signatures, so a record one rank lacks (a sampled trace) shifts nothing after it."""
    from difflib import SequenceMatcher

    by_channel: dict[tuple[Any, ...], dict[int, list[CommRecord]]] = defaultdict(lambda: defaultdict(list))
    for rc in ranks:
        for record in rc.records:
            by_channel[_channel(record, mode, streams.get(rc.rank, {}))][rc.rank].append(record)
    out: dict[int, list[tuple[tuple[Any, ...], CommRecord]]] = defaultdict(list)
    for channel, per_rank in by_channel.items():
        for records in per_rank.values():  # in the order issued, which the runs' starts may swap
            records.sort(key=lambda r: r.start_us if r.issued_us is None else r.issued_us)
        reference = max(per_rank, key=lambda rank: (len(per_rank[rank]), -rank))
        wanted = [_signature(r) for r in per_rank[reference]]
        for rank, records in per_rank.items():
            mine = [_signature(r) for r in records] if rank != reference else wanted
            if mine == wanted:  # the common case: the same sequence as the reference, nothing to align
                position = {j: j for j in range(len(records))}
            else:
                blocks = SequenceMatcher(None, wanted, mine, autojunk=False)
                position = {b + k: a + k for a, b, size in blocks.get_matching_blocks() for k in range(size)}
            for j, record in enumerate(records):
                i = position.get(j)
                key = (*channel, i) if i is not None else (*channel, "unmatched", rank, j)
                out[rank].append((key, record))
    return out


def _bandwidth(kind: str, nbytes: int | None, transfer_us: float,
               n: int) -> tuple[float | None, float | None]:
    if not nbytes or transfer_us <= 0:
        return None, None
    algbw = nbytes / (transfer_us * 1e3)  # bytes per microsecond -> GB/s
    return algbw, algbw * bus_factor(kind, n)


def _instance(index: int, key: tuple[Any, ...], members: dict[int, CommRecord], loaded: set[int],
              world_size: int | None) -> CollectiveInstance:
    starts = {rank: r.start_us for rank, r in members.items()}
    first_rank = min(starts, key=starts.__getitem__)
    last_rank = max(starts, key=starts.__getitem__)
    first, last = starts[first_rank], starts[last_rank]
    kinds = Counter(r.kind for r in members.values())
    kind = kinds.most_common(1)[0][0]
    sample = next((r for r in members.values() if r.nbytes), next(iter(members.values())))
    described = next((r for r in members.values() if r.pg_ranks or r.group_size), sample)
    n = described.group_size or (len(described.pg_ranks) if described.pg_ranks else None)
    expected = [r for r in (described.pg_ranks or []) if r in loaded]
    transfer = members[last_rank].dur_us
    traffic = _variable_traffic(kind, members)
    nbytes = max(max(pair) for pair in traffic.values()) if traffic else sample.nbytes
    algbw, busbw = _bandwidth(kind, nbytes, transfer, n or world_size or len(members))
    return {
        "id": index, "kind": kind, "pg": sample.pg, "pg_desc": sample.pg_desc, "seq": sample.seq,
        "step": sample.step, "channel": sample.channel,
        "order": key[-1] if sample.seq is None and "unmatched" not in key else None,
        "unmatched": "unmatched" in key,
        "ranks": len(members), "missing_ranks": sorted(set(expected) - set(members)),
        "group_size": n, "group_size_assumed": n is None, "bytes": nbytes,
        "bytes_assumed": any(r.size_assumed for r in members.values()), "dtype": sample.dtype,
        "algorithm": sample.algorithm, "protocol": sample.protocol,
        "first_start_us": first, "skew_us": last - first, "first_rank": first_rank, "last_rank": last_rank,
        "arrival_offset_us": {rank: s - first for rank, s in sorted(starts.items())},
        "dur_us": {rank: r.dur_us for rank, r in sorted(members.items())},
        "dur_min_us": min(r.dur_us for r in members.values()),
        "dur_max_us": max(r.dur_us for r in members.values()),
        "transfer_us": transfer, "algbw_gbps": algbw, "busbw_gbps": busbw,
        "wait_caused_us": sum(last - s for s in starts.values()),
        "kinds_differ": {rank: r.kind for rank, r in sorted(members.items())} if len(kinds) > 1 else None,
        "bytes_by_rank": traffic or None,
    }


def _variable_traffic(kind: str, members: dict[int, CommRecord]) -> dict[int, list[int]]:
    """``rank -> [sent, received]`` of an all-to-all whose ranks moved different amounts ({}: the
    same everywhere, or unknown on a rank)."""
    if kind != "all_to_all":
        return {}
    known: dict[int, list[int]] = {}
    for rank, record in sorted(members.items()):
        if record.nbytes is None or record.recv_bytes is None:
            return {}
        known[rank] = [record.nbytes, record.recv_bytes]
    return known if len({v for pair in known.values() for v in pair}) > 1 else {}


def experts_side(bytes_by_rank: dict[int, list[int]] | None) -> int | None:
    """Which side of a variable-size all-to-all holds the experts' tokens: 1 (received: a dispatch,
    every rank sending its own batch, the experts getting what the router gave them) or 0 (sent: a
    combine, the experts sending their results back); the side whose sizes differ more between ranks
    (relative to their mean).  None for an all-to-all whose sizes are equal or unknown.

    Args:
        bytes_by_rank: the instance's ``[sent, received]`` bytes per rank.
    """
    if not bytes_by_rank:
        return None

    def spread(values: list[int]) -> float:
        mean = statistics.fmean(values)
        return (max(values) - min(values)) / mean if mean > 0 else 0.0

    pairs = list(bytes_by_rank.values())
    return 1 if spread([p[1] for p in pairs]) >= spread([p[0] for p in pairs]) else 0


def _traffic_by_rank(instances: list[CollectiveInstance]) -> list[RankTraffic]:
    """Each rank's bytes over the variable-size all-to-alls, the most traffic first."""
    sent: dict[int, int] = defaultdict(int)
    received: dict[int, int] = defaultdict(int)
    for inst in instances:
        for rank, (out, into) in (inst["bytes_by_rank"] or {}).items():
            sent[rank] += out
            received[rank] += into
    if not received:
        return []
    mean = statistics.fmean(sent[rank] + received[rank] for rank in received)
    rows: list[RankTraffic] = [{"rank": rank, "sent_bytes": sent[rank], "received_bytes": received[rank],
                                "traffic_vs_mean": (sent[rank] + received[rank]) / mean if mean else 0.0}
                               for rank in received]
    return sorted(rows, key=lambda r: (-r["traffic_vs_mean"], r["rank"]))


def _rank_table(instances: list[CollectiveInstance], ranks: list[int]) -> list[RankWait]:
    rows: dict[int, RankWait] = {
        rank: {"rank": rank, "collectives": 0, "last_arrivals": 0, "wait_caused_us": 0.0, "waited_us": 0.0,
               "late_us": 0.0, "wait_caused_pct": 0.0} for rank in ranks}
    for inst in instances:
        if inst["ranks"] < 2:
            continue
        for rank, offset in inst["arrival_offset_us"].items():
            row = rows[rank]
            row["collectives"] += 1
            row["late_us"] += offset
            row["waited_us"] += inst["skew_us"] - offset
        rows[inst["last_rank"]]["last_arrivals"] += 1
        rows[inst["last_rank"]]["wait_caused_us"] += inst["wait_caused_us"]
    total = sum(r["wait_caused_us"] for r in rows.values())
    for row in rows.values():
        row["wait_caused_pct"] = 100.0 * row["wait_caused_us"] / total if total > 0 else 0.0
    return sorted(rows.values(), key=lambda r: (-r["wait_caused_us"], -r["late_us"], r["rank"]))


def _by_type(instances: list[CollectiveInstance]) -> list[TypeTotal]:
    groups: dict[tuple[str, str], list[CollectiveInstance]] = defaultdict(list)
    for inst in instances:
        groups[(inst["kind"], inst["pg"] if inst["pg"] is not None else "-")].append(inst)
    out: list[TypeTotal] = []
    for (kind, pg), found in groups.items():
        busbw = [i["busbw_gbps"] for i in found if i["busbw_gbps"] is not None]
        out.append({"kind": kind, "pg": pg, "count": len(found), "bytes": sum(i["bytes"] or 0 for i in found),
                    "skew_mean_us": statistics.fmean(i["skew_us"] for i in found),
                    "skew_max_us": max(i["skew_us"] for i in found),
                    "transfer_us": sum(i["transfer_us"] for i in found),
                    "busbw_median_gbps": statistics.median(busbw) if busbw else None})
    return sorted(out, key=lambda r: -r["transfer_us"])


def _notes(ranks: Sequence[RankComms], instances: list[CollectiveInstance], same_streams: bool) -> list[str]:
    notes = []
    world = next((rc.world_size for rc in ranks if rc.world_size), None)
    if world and len(ranks) < world:
        notes.append(f"{len(ranks)} of {world} ranks' traces: skew and last arrival are among these ranks "
                     "only.")
    if not same_streams:
        notes.append("the ranks' NCCL streams differ: streams were paired by their order of first use.")
    unmatched = sum(1 for i in instances if i["unmatched"])
    if unmatched and len(ranks) > 1:
        notes.append(f"{unmatched} records have no counterpart on the other ranks (type and size did not "
                     "line up; a sampled or truncated trace?): listed, not compared.")
    differ = sum(1 for i in instances if i["kinds_differ"])
    if differ:
        notes.append(f"{differ} matched instances have different collective types on different ranks: the "
                     "ordering fallback is unreliable for them (the traces carry no sequence numbers).")
    sizes = {g.get("pg_size") for rc in ranks for g in rc.pg_config if isinstance(g, dict)}
    subgroups = not world or not sizes or sizes - {world}
    if subgroups and any(i["group_size_assumed"] for i in instances if i["busbw_gbps"] is not None):
        notes.append("group sizes not recorded: bus bandwidth assumes the whole world (or the ranks "
                     "present).")
    if any(rc.source and "gloo" in rc.source for rc in ranks) and not any(i["bytes"] for i in instances):
        notes.append("no message sizes: record with --torch-profile-record-shapes to get gloo's sizes and "
                     "bandwidth.")
    missing = [rc.rank for rc in ranks if not rc.records]
    if missing:
        notes.append(f"no collectives found in the traces of ranks {missing}.")
    return notes


def match_collectives(ranks: Sequence[RankComms], top: int = 20,
                      members: dict[int, dict[int, CommRecord]] | None = None) -> CollectivesReport:
    """The collectives of one cycle's traces matched across ranks.

    Args:
        ranks: one :class:`RankComms` per rank (:func:`~.collectives.rank_collectives`).
        top: instances listed in ``worst_skew``.
        members: when given, receives each instance's records: instance id -> rank -> record (the
            critical path joins the ranks' graphs there).

    Returns:
        The report: how instances were matched, each instance, the ranks by the waiting they
        caused, a row per collective type, notes on what the traces lack.
    """
    ranks = sorted(ranks, key=lambda rc: rc.rank)
    mode = _mode(ranks)
    streams, same_streams = _stream_names(ranks) if mode == MATCH_STREAM_ORDER else ({}, True)
    keyed = _seq_keys(ranks) if mode == MATCH_SEQ else _aligned_keys(ranks, mode, streams)
    groups: dict[tuple[Any, ...], dict[int, CommRecord]] = {}
    for rank in sorted(keyed):
        for key, record in keyed[rank]:
            groups.setdefault(key, {}).setdefault(rank, record)
    loaded = {rc.rank for rc in ranks}
    world = next((rc.world_size for rc in ranks if rc.world_size), None)
    ordered = sorted(groups.items(), key=lambda item: min(r.start_us for r in item[1].values()))
    instances = [_instance(i, key, found, loaded, world) for i, (key, found) in enumerate(ordered)]
    if members is not None:
        members.update({i: found for i, (_, found) in enumerate(ordered)})
    worst = sorted((i for i in instances if i["ranks"] > 1), key=lambda i: -i["skew_us"])[:top]
    rank_rows = _rank_table(instances, [rc.rank for rc in ranks])
    return {
        "ranks": [rc.rank for rc in ranks], "world_size": world,
        "files": {rc.rank: rc.file for rc in ranks},
        "source": next((rc.source for rc in ranks if rc.source), None), "matched_by": mode,
        "collective_count": len(instances),
        "process_groups": sorted({i["pg"] for i in instances if i["pg"] is not None}),
        "wait_caused_total_us": sum(r["wait_caused_us"] for r in rank_rows),
        "ranks_by_wait_caused": rank_rows,
        "worst_skew": [i["id"] for i in worst],
        "by_type": _by_type(instances),
        "all_to_all_by_rank": _traffic_by_rank(instances),
        "notes": _notes(ranks, instances, same_streams),
        "instances": instances,
    }
