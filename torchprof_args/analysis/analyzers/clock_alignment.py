"""The hosts' clocks of one cycle, as every cross-rank answer states them: :class:`ClockAlignment`
(each host's :class:`HostClock`), and :func:`aligned_comms`, a rank's collectives on the reference
host's clock.  Estimated by :func:`~.clocks.align_clocks` (its docstring says how)."""

from __future__ import annotations

from dataclasses import replace

import msgspec

from torchprof_args.analysis.analyzers.collectives import RankComms

__all__ = ["ClockAlignment", "HostClock", "aligned_comms"]


class HostClock(msgspec.Struct, frozen=True):
    """One host's clock against the reference host's (the first rank's).

    Attributes:
        host: its name, as its traces give it.
        ranks: its ranks among those read.
        offset_us: what is added to its times to put them on the reference's clock (at ``at_us``).
        uncertainty_us: how far the offset may be off (the spread of its shared collectives' ends).
        collectives: the collectives it shares with other hosts (what the estimate rests on).
        bounds_us: the interval causality leaves the offset (``[low, high]``; None: no bound).
        drift_us_per_s: how fast its clock moves against the reference's, where estimated and
            larger than the uncertainty over the window (None otherwise).
        at_us: the time (its own clock, absolute us) the offset holds at, where a drift applies.
    """

    host: str
    ranks: list[int]
    offset_us: float
    uncertainty_us: float
    collectives: int
    bounds_us: list[float] | None = None
    drift_us_per_s: float | None = None
    at_us: float = 0.0

    def offset_at(self, t_us: float) -> float:
        """The offset at time ``t_us`` (its own clock's absolute us)."""
        if self.drift_us_per_s is None:
            return self.offset_us
        return self.offset_us + self.drift_us_per_s * (t_us - self.at_us) / 1e6


class ClockAlignment(msgspec.Struct, frozen=True):
    """The hosts' clocks of one cycle (``--json``'s ``clock``).

    Attributes:
        hosts: each host's clock, the reference (offset 0) first.
        aligned: whether the offsets were applied to every time compared across ranks.
        collectives: the collectives shared by two or more hosts.
        reason: why nothing was applied (one host, hosts not recorded, too few shared
            collectives, alignment turned off); None when aligned.
        basis: what the offsets rest on: "collectives" (their ends), "step boundaries" (too few
            collectives: those and the ends of the steps bounded by one every rank waits in),
            "flight recorder" (``torchprof hang``: its records); None where nothing was estimated.
        boundaries: the step ends read besides the collectives ("step boundaries").
    """

    hosts: list[HostClock]
    aligned: bool
    collectives: int
    reason: str | None = None
    basis: str | None = None
    boundaries: int = 0

    def host_of(self, rank: int) -> HostClock | None:
        """The clock of ``rank``'s host (None: not one of the ranks read)."""
        return next((h for h in self.hosts if rank in h.ranks), None)

    def offset_us(self, rank: int, t_us: float = 0.0) -> float:
        """What is added to ``rank``'s time ``t_us`` to put it on the reference clock (0 when not
        aligned)."""
        clock = self.host_of(rank) if self.aligned else None
        return clock.offset_at(t_us) if clock is not None else 0.0

    def uncertainty_between_us(self, rank_a: int, rank_b: int) -> float:
        """How far apart two of ``rank_a``'s and ``rank_b``'s aligned times may be put that were the
        same moment: 0 on one host (or not aligned), else the sum of the two hosts' uncertainties."""
        a, b = self.host_of(rank_a), self.host_of(rank_b)
        if not self.aligned or a is None or b is None or a.host == b.host:
            return 0.0
        return a.uncertainty_us + b.uncertainty_us

    def text(self) -> str:
        """What was done: ``2 hosts aligned on 96 collectives; host b +50.02 ms (+-0.21)``."""
        if len(self.hosts) < 2:
            return self.reason or "one host: one clock"
        moved = _moved_text(self.hosts[1:])
        if self.aligned:
            return f"{len(self.hosts)} hosts aligned on {self._readings()}; {moved}"
        estimated = f"; estimated {moved}" if any(h.collectives for h in self.hosts[1:]) else ""
        return f"{len(self.hosts)} hosts, not aligned ({self.reason}){estimated}"

    def _readings(self) -> str:
        """What the offsets rest on, in words: ``4 collectives``, ``2 collectives and 2 step ends``."""
        if self.basis == "step boundaries":
            return (f"{self.collectives} collectives and {self.boundaries} step ends after one "
                    f"(too few collectives)")
        if self.basis == "flight recorder":
            return f"{self.collectives} flight-recorder collectives"
        return f"{self.collectives} collectives"

    def line(self) -> str | None:
        """``clock: ...`` (:meth:`text`) where the ranks ran on several hosts; None on one."""
        return f"clock: {self.text()}" if len(self.hosts) > 1 else None


#: hosts named one by one in :meth:`ClockAlignment.text`, the furthest off first; the rest in one clause.
NAMED_HOSTS = 3


def _moved_text(hosts: list[HostClock]) -> str:
    """The hosts' offsets: each one for a few hosts, else the furthest off and the range of the rest."""
    ranked = sorted(hosts, key=lambda h: -abs(h.offset_us))
    named = "; ".join(_host_text(h) for h in ranked[:NAMED_HOSTS])
    rest = ranked[NAMED_HOSTS:]
    if not rest:
        return named
    worst = max(h.uncertainty_us for h in rest)
    return (f"{named}; {len(rest)} other hosts within {max(abs(h.offset_us) for h in rest) / 1e3:.2f} ms "
            f"(+-{worst / 1e3:.2f} at most)")


def _host_text(clock: HostClock) -> str:
    text = f"host {clock.host} {clock.offset_us / 1e3:+.2f} ms (+-{clock.uncertainty_us / 1e3:.2f})"
    if clock.drift_us_per_s is not None:
        text += f", drifting {clock.drift_us_per_s:+.1f} us/s"
    return text


def aligned_comms(rc: RankComms, clock: ClockAlignment) -> RankComms:
    """``rc`` with its records' times on the reference clock (itself when nothing moves)."""
    host = clock.host_of(rc.rank) if clock.aligned else None
    if host is None or (host.offset_us == 0.0 and host.drift_us_per_s is None):
        return rc
    records = [replace(r, start_us=r.start_us + host.offset_at(r.start_us),
                       issued_us=None if r.issued_us is None else r.issued_us + host.offset_at(r.issued_us))
               for r in rc.records]
    return replace(rc, records=records)
