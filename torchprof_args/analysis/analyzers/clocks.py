"""One clock per host: each host's clock offset, estimated from the collectives its ranks share
(:func:`align_clocks`; the result, :class:`~.clock_alignment.ClockAlignment`).

Every cross-rank answer (who arrived last at a collective, the waiting each rank caused, the
straggler, the critical path's joins) compares times written by different processes.  Ranks on one
host share its clock; ranks on different hosts do not: NTP keeps wall clocks milliseconds apart at
worst, hundreds of microseconds at best, the size of the skews measured.

The estimate rests on what a collective is: its ranks leave it together.  An NCCL kernel ends on
every rank within microseconds of the others (gloo's worker threads, within a little more), while
the ranks *arrive* whenever they get there.  So per shared collective, each host's ends (the median
of its ranks') are a reading of one moment on that host's clock, and a host's offset is the value
that best puts its readings on the others' (alternating medians over every shared collective: a
robust consensus, where an outlier collective moves nothing).  Arrivals are left as they were: a
late rank stays late.  Causality bounds the offset: no rank can leave a collective before its last
rank arrived, which, intersected over every shared collective, gives each host an interval its
offset must lie in (the classic constraint of parallel-trace tools); an estimate outside it is
moved to its nearest end.

Each host's uncertainty is the spread of its collectives' readings around the estimate (1.4826 x
their median absolute deviation), not that spread over sqrt(n): a host whose ranks always end a
little later than the others' (an NCCL tree's root) is off by that much whatever the count.  Nor
can the spread see a bias that comes with a host's role: on the CPU (gloo) the rank that arrived
last ends a little later (or earlier) than those that waited for it.  Where a host was sometimes
last and sometimes not, half the difference between the two groups' readings bounds that bias from
below; where it always was (a straggler) or never was, the bias cannot be told from the offset.
On the CPU the ends of one collective are known only within its transfer time (the shortest time a
rank spent in it: the last arrival's, which waited for nobody; every rank ends between that
arrival and about its end), so the median transfer time is the least uncertainty either way.
Which host arrived last is read once the offsets are estimated, on the reference clock: on the
hosts' own clocks an offset larger than the skews would decide it, and the uncertainty stated
would grow with the offset.

A drift (one clock running faster) is estimated where 16 or more collectives span the window
(Theil-Sen's slope, scipy) and applied when the change it makes over the window exceeds the
uncertainty and its 95 % interval excludes zero.

Where a host shares fewer than 3 such collectives (a window of a step or two), the ends of the steps
every rank recorded, each bounded by a collective every rank waits in, are read with them (basis "step
boundaries"): one moment, off by how much the ranks' work after that collective differs, measured
without a clock (each rank's time from that collective's end to its step's end) and a floor of the
uncertainty; no causality bound.  The estimator takes its readings as :class:`SharedMoment` from
any source (:func:`clocks_from_moments`): ``torchprof hang`` gives it the flight recorder's records.

A single host needs none of it; traces that do not say their host are taken as one clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from torchprof_args.analysis.analyzers.clock_alignment import ClockAlignment, HostClock
from torchprof_args.analysis.analyzers.collective_match import MATCH_SEQ, SAME_SIZE_KINDS, match_collectives
from torchprof_args.analysis.analyzers.collectives import GPU_CHANNEL, SOURCE_HOST, CommRecord, RankComms

__all__ = ["BASIS_COLLECTIVES", "BASIS_FLIGHT_RECORDER", "BASIS_STEPS", "UNKNOWN_HOST", "SharedMoment",
           "align_clocks", "alignment", "clocks_from_moments", "unaligned"]

#: the collectives no rank can leave before every rank arrived (each needs every other's data).
EVERY_RANK_WAITS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})
#: what an alignment rests on (``ClockAlignment.basis``): the collectives' ends; where too few, those and
#: the ends of the steps bounded by one; in ``torchprof hang``, the flight recorder's records.
BASIS_COLLECTIVES = "collectives"
BASIS_STEPS = "step boundaries"
BASIS_FLIGHT_RECORDER = "flight recorder"
#: the host of the ranks whose traces (or dumps) do not say theirs.
UNKNOWN_HOST = "?"
#: shared collectives a host needs before its offset is estimated.
MIN_SHARED = 3
#: shared collectives, spread over the window, before a drift is estimated.
MIN_FOR_DRIFT = 16
#: the median absolute deviation of a normal distribution, as its standard deviation.
_MAD_TO_SIGMA = 1.4826
#: the floor of an uncertainty (us): the resolution of the traces' times.
_RESOLUTION_US = 1.0
#: the alternating medians stop when no offset moves more than this (us).
_CONVERGED_US = 1e-3


def _hosts(ranks: Sequence[RankComms]) -> dict[str, list[int]]:
    """Host -> its ranks, the reference host (the lowest rank's) first."""
    by_host: dict[str, list[int]] = defaultdict(list)
    for rc in sorted(ranks, key=lambda r: r.rank):
        by_host[rc.host or UNKNOWN_HOST].append(rc.rank)
    return dict(by_host)


def _group_median(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """The median of ``values`` per group ``0..n-1`` (NaN for an empty group), without a loop."""
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    counts = np.bincount(g, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    out = np.full(n, np.nan)
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = (v[lo] + v[hi]) / 2.0
    return out


@dataclass(frozen=True)
class SharedMoment:
    """One moment several ranks passed together, as each rank's clock read it: a collective's end (no
    rank leaves before every rank arrived), a step boundary right after one, a flight-recorder record.

    Attributes:
        ends_us: rank -> when it left (its clock, absolute us): the readings.
        arrivals_us: rank -> when it arrived, where known: causality's bounds (no rank leaves before the
            last arrival); empty for a step boundary (no bound, no role).
        precision_us: how precisely the ends are one moment where their spread cannot show it (the CPU's
            transfer time; a step boundary's spread of the ranks' work after their last collective).
    """

    ends_us: dict[int, float]
    arrivals_us: dict[int, float] = field(default_factory=dict)
    precision_us: float = 0.0


class _Readings:
    """Per (shared moment, host): its ranks' median end, latest arrival and earliest end, and whether
    it arrived last; per shared moment, its precision."""

    def __init__(self, moments: Sequence[SharedMoment], host_index: dict[int, int]) -> None:
        inst: list[int] = []
        host: list[int] = []
        end: list[float] = []
        last_arrival: list[float] = []
        first_end: list[float] = []
        ranked: list[bool] = []
        precision: list[float] = []
        shared = 0
        for moment in moments:
            per_host: dict[int, list[int]] = defaultdict(list)
            for rank in moment.ends_us:
                per_host[host_index[rank]].append(rank)
            if len(per_host) < 2:
                continue
            arrivals = moment.arrivals_us
            precision.append(moment.precision_us)
            for h, members in per_host.items():
                ends = sorted(moment.ends_us[rank] for rank in members)
                inst.append(shared)
                host.append(h)
                end.append((ends[(len(ends) - 1) // 2] + ends[len(ends) // 2]) / 2.0)
                last_arrival.append(max((arrivals[r] for r in members if r in arrivals), default=-np.inf))
                first_end.append(ends[0])
                ranked.append(bool(arrivals))
            shared += 1
        self.shared = shared
        self.inst = np.array(inst, dtype=np.int64)
        self.host = np.array(host, dtype=np.int64)
        self.end = np.array(end, dtype=np.float64)
        self.last_arrival = np.array(last_arrival, dtype=np.float64)
        self.first_end = np.array(first_end, dtype=np.float64)
        self.precision = np.array(precision, dtype=np.float64)
        #: the reading has arrivals (a collective): a role, and causality's bounds
        self.ranked = np.array(ranked, dtype=bool)
        #: whether the host arrived last at the moment (:meth:`relabel`, once the offsets are known)
        self.holds_last = np.zeros(len(inst), dtype=bool)

    def relabel(self, offset: np.ndarray) -> None:
        """Which host arrived last at each moment, on the reference clock (``offset`` per host): on
        the hosts' own clocks an offset larger than the skews decides it, and with it the role bias."""
        shifted = self.last_arrival + offset[self.host]
        latest = np.full(self.shared, -np.inf)
        np.maximum.at(latest, self.inst, shifted)
        self.holds_last = self.ranked & np.isfinite(shifted) & (shifted == latest[self.inst])


def _collective_moment(found: dict[int, CommRecord]) -> SharedMoment:
    """A matched collective's ends and arrivals (its precision: on the CPU, where the ends are known
    only within it, its transfer time: the shortest time a rank spent in it, the last arrival's,
    which waited for nobody; read without comparing clocks)."""
    on_gpu = all(r.channel.startswith(GPU_CHANNEL) for r in found.values())
    return SharedMoment({rank: r.start_us + r.dur_us for rank, r in found.items()},
                        {rank: r.start_us for rank, r in found.items()},
                        0.0 if on_gpu else min(r.dur_us for r in found.values()))


def _one_collective(found: dict[int, CommRecord], by_seq: bool) -> bool:
    """Whether ``found`` is surely one collective on every rank whose ends are one moment: two or
    more ranks, one type in which every rank needs every other's data (a broadcast's root, a
    send, may finish before the others arrive), matched by sequence number or of one size
    everywhere (an all-to-all matched by order may pair different instances: its sizes differ
    anyway)."""
    kinds = {r.kind for r in found.values()}
    if len(found) < 2 or len(kinds) != 1 or not kinds <= EVERY_RANK_WAITS:
        return False
    return by_seq or (kinds <= SAME_SIZE_KINDS and len({r.nbytes for r in found.values()}) == 1)


def _offsets(r: _Readings, n_hosts: int) -> np.ndarray:
    """Each host's offset: alternating medians (each collective's moment = the median of its hosts'
    ends on the reference clock; each host's offset = the median of the moments minus its ends),
    host 0 held at 0."""
    offset = np.zeros(n_hosts)
    for _ in range(50):
        moment = _group_median(r.inst, r.end + offset[r.host], r.shared)
        new = _group_median(r.host, moment[r.inst] - r.end, n_hosts)
        new = np.nan_to_num(new - new[0])
        moved = float(np.max(np.abs(new - offset)))
        offset = new
        if moved < _CONVERGED_US:
            break
    return offset


def _others(r: _Readings, offset: np.ndarray, h: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For host ``h``'s shared collectives: the other hosts' median end, latest arrival and earliest
    end (reference clock), and ``h``'s rows."""
    mine = r.host == h
    rest = ~mine
    inst = r.inst[rest]
    moment = _group_median(inst, r.end[rest] + offset[r.host[rest]], r.shared)
    latest = np.full(r.shared, -np.inf)
    np.maximum.at(latest, inst, r.last_arrival[rest] + offset[r.host[rest]])
    earliest = np.full(r.shared, np.inf)
    np.minimum.at(earliest, inst, r.first_end[rest] + offset[r.host[rest]])
    return moment, latest, earliest, mine


def _drift(t: np.ndarray, d: np.ndarray, uncertainty: float) -> tuple[float, float, float] | None:
    """(slope, intercept at the median time, that time) where the readings drift beyond the
    uncertainty over the window; None otherwise."""
    if len(t) < MIN_FOR_DRIFT or float(np.ptp(t)) <= 0:
        return None
    from scipy.stats import theilslopes

    keep = np.linspace(0, len(t) - 1, min(len(t), 2000)).astype(np.int64)
    at = float(np.median(t))
    slope, intercept, low, high = theilslopes(d[keep], t[keep] - at)
    if low <= 0.0 <= high or abs(slope) * float(np.ptp(t)) <= uncertainty:
        return None
    return float(slope), float(intercept), at


def _role_bias(readings: np.ndarray, last: np.ndarray, precision: np.ndarray) -> float:
    """How far a host's role in its collectives (arriving last, or waiting) may bias its readings
    (the module's docstring says how), and at least how precisely the ends are one moment (on the
    CPU, the transfer time)."""
    floor = float(np.median(precision))
    if last.any() and not last.all():
        return max(abs(float(np.median(readings[last])) - float(np.median(readings[~last]))) / 2.0, floor)
    return floor


def _host_clock(r: _Readings, offset: np.ndarray, h: int, name: str, ranks: list[int]) -> HostClock:
    """Host ``h``'s offset checked against causality, its uncertainty and drift."""
    if h == 0:
        return HostClock(name, ranks, 0.0, 0.0, int(np.count_nonzero(r.host == 0)))
    moment, latest, earliest, mine = _others(r, offset, h)
    inst = r.inst[mine]
    readings = moment[inst] - r.end[mine]  # each collective's estimate of this host's offset
    n = len(readings)
    if n < MIN_SHARED:
        return HostClock(name, ranks, 0.0, 0.0, n)
    estimate = float(offset[h])
    spread = _MAD_TO_SIGMA * float(np.median(np.abs(readings - estimate)))
    ranked = r.ranked[mine]
    role = (_role_bias(readings[ranked], r.holds_last[mine][ranked], r.precision[inst][ranked])
            if ranked.any() else 0.0)
    boundary = float(np.median(r.precision[inst][~ranked])) if not ranked.all() else 0.0
    # step boundaries beside collectives: the two kinds of reading may disagree by more than either spreads
    apart = (abs(float(np.median(readings[ranked])) - float(np.median(readings[~ranked])))
             if ranked.any() and not ranked.all() else 0.0)
    uncertainty = max(spread, role, boundary, apart, _RESOLUTION_US)
    # no rank of this host leaves before the others' last arrival, nor arrives after they left
    low = float(np.max(latest[inst] - r.first_end[mine]))
    high = float(np.min(earliest[inst] - r.last_arrival[mine]))
    bounds = [low, high] if low <= high and np.isfinite(low) and np.isfinite(high) else None
    if bounds is not None:
        estimate = min(max(estimate, low), high)
    drift = _drift(r.end[mine], readings, uncertainty)
    if drift is not None:
        slope, intercept, at = drift
        return HostClock(name, ranks, intercept, uncertainty, n, bounds, slope * 1e6, at)
    return HostClock(name, ranks, estimate, uncertainty, n, bounds)


def _blocking(record: CommRecord, ranks: set[int]) -> bool:
    """Whether every rank read waits for every other in ``record`` (a collective of theirs all)."""
    return (record.kind in EVERY_RANK_WAITS and (record.pg_ranks is None or ranks <= set(record.pg_ranks))
            and (record.group_size is None or record.group_size >= len(ranks)))


def _step_moments(ranks: Sequence[RankComms]) -> list[SharedMoment]:
    """The ends of the steps every rank recorded, each rank's step bounded by a collective every rank
    waits in: a reading of one moment within how much the ranks' work after that collective differs
    (its spread across ranks, clock-free: the boundary's precision)."""
    members = {rc.rank for rc in ranks}
    ends: dict[str, dict[int, float]] = defaultdict(dict)
    after: dict[str, dict[int, float]] = defaultdict(dict)
    for rc in ranks:
        for span in rc.steps:
            end = span["start_us"] + span["dur_us"]
            # its last such collective (a CPU record may end a little after the thread went on)
            left = [r.start_us + r.dur_us for r in rc.records
                    if r.step == span["name"] and _blocking(r, members)]
            if left:
                ends[span["name"]][rc.rank] = end
                after[span["name"]][rc.rank] = end - max(left)
    return [SharedMoment(ends[name], precision_us=max(after[name].values()) - min(after[name].values()))
            for name in ends if ends[name].keys() == members]


def clocks_from_moments(moments: Sequence[SharedMoment],
                        hosts: dict[str, list[int]]) -> tuple[list[HostClock], int]:
    """THE estimator: each host's clock from the moments its ranks shared with other hosts' (the
    module's docstring says how), and how many moments spanned two or more hosts.

    Args:
        moments: what was read (collectives' ends, step boundaries, flight-recorder records).
        hosts: host -> its ranks, the reference host first.

    Returns:
        Each host's :class:`HostClock` (``collectives``: the moments it shares; under
        :data:`MIN_SHARED`, offset 0) and the count of shared moments.
    """
    names = list(hosts)
    host_index = {rank: i for i, name in enumerate(names) for rank in hosts[name]}
    readings = _Readings(moments, host_index)
    offset = _offsets(readings, len(names)) if readings.shared else np.zeros(len(names))
    readings.relabel(offset)
    clocks = [_host_clock(readings, offset, i, name, hosts[name]) for i, name in enumerate(names)]
    return clocks, readings.shared


def unaligned(hosts: dict[str, list[int]], reason: str) -> ClockAlignment:
    """No alignment, every offset 0: on one host (one clock, said so), else for ``reason`` (hosts
    named :data:`UNKNOWN_HOST`: some inputs do not say theirs)."""
    zero = [HostClock(name, members, 0.0, 0.0, 0) for name, members in hosts.items()]
    return ClockAlignment(zero, aligned=False, collectives=0,
                          reason="one host: one clock" if len(hosts) < 2 else reason)


def alignment(clocks: list[HostClock], shared: int, basis: str, *, apply: bool = True,
              too_few: str = "collectives", boundaries: int = 0) -> ClockAlignment:
    """The :class:`ClockAlignment` of :func:`clocks_from_moments`' clocks: not aligned (with the reason:
    a host shares fewer than :data:`MIN_SHARED` ``too_few``) where a host does, or ``apply`` is False."""
    lacking = [c.host for c in clocks[1:] if c.collectives < MIN_SHARED]
    if lacking:
        reason = f"host {lacking[0]} shares fewer than {MIN_SHARED} {too_few} with the others"
        return ClockAlignment(clocks, aligned=False, collectives=shared, reason=reason, basis=basis,
                              boundaries=boundaries)
    if not apply:
        return ClockAlignment(clocks, aligned=False, collectives=shared, basis=basis, boundaries=boundaries,
                              reason="turned off by --no-align-clocks")
    return ClockAlignment(clocks, aligned=True, collectives=shared, basis=basis, boundaries=boundaries)


def align_clocks(ranks: Sequence[RankComms], *, apply: bool = True) -> ClockAlignment:
    """Each host's clock offset in one cycle, from the collectives its ranks share with other hosts;
    where a host shares fewer than :data:`MIN_SHARED`, from those and the ends of the steps bounded by
    a collective every rank waits in (``basis`` "step boundaries", a larger uncertainty).

    Args:
        ranks: one :class:`RankComms` per rank, each with its ``host`` (None: not recorded) and steps.
        apply: False: estimated and said, not applied (``--no-align-clocks``).

    Returns:
        The :class:`ClockAlignment`; ``aligned`` False (with its ``reason``) on one host, where the
        traces do not say their hosts, where a host shares too few collectives and step boundaries, or
        where the collectives' ends are not recorded (host-side records only).
    """
    hosts = _hosts(ranks)
    if len(hosts) < 2 or UNKNOWN_HOST in hosts:
        return unaligned(hosts, "some traces do not say their host: their clocks are taken as one")
    if any(rc.source == SOURCE_HOST for rc in ranks):
        return unaligned(hosts, "host-side collective records only: their ends are not recorded")
    members: dict[int, dict[int, CommRecord]] = {}
    by_seq = match_collectives(ranks, top=0, members=members)["matched_by"] == MATCH_SEQ
    collectives = [_collective_moment(found) for found in members.values() if _one_collective(found, by_seq)]
    clocks, shared = clocks_from_moments(collectives, hosts)
    if all(c.collectives >= MIN_SHARED for c in clocks[1:]):
        return alignment(clocks, shared, BASIS_COLLECTIVES, apply=apply)
    steps = _step_moments(ranks)
    clocks, together = clocks_from_moments([*collectives, *steps], hosts)
    return alignment(clocks, shared, BASIS_STEPS, apply=apply, boundaries=together - shared,
                     too_few="collectives and step ends after one every rank waits in")
