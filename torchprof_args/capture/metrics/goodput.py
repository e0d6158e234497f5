"""The goodput ledger: a job's wall time split into productive training and the time lost, by cause.

Read from the job's ``metrics.jsonl`` across restarts (:mod:`~torchprof_args.shared.metrics_log` marks
each process's lines), the wall time (the first process's start to the last one's end) is cut into
pieces, each split between ``productive`` and the :data:`CATEGORIES` of lost time:

* **startup**: a process's start to its metrics writer's start (the first step), less the
  checkpoint load timed in there;
* **checkpoint**, **data**, **evaluation**: the step timers of :data:`TIMER_CATEGORIES` in each log
  interval (``timers/<name>-time`` is seconds per iteration, so times the interval's iterations;
  DeepSpeed's ``deepspeed/<name>-ms`` per step likewise); load timers count against start-up;
* **profiling**: the profiler's own cost, the growth of ``profiler/cost_seconds_total`` (flush
  stalls, snapshot dumps, the slowdown of recorded steps and of the steps beside a publisher:
  :mod:`~torchprof_args.capture.runtime.cost`) in each interval;
* **hang**: the time a process lived after its last logged interval beyond one usual interval;
* **restart**: the work a process did past the iteration the next process resumed from (redone),
  its life after its last record, and the time between the two processes;
* **other**: the rest (time after the last record of a run that ended cleanly, losses that
  overlapped).

:func:`build_ledger` takes ``since``/``now`` for the rolling window of the Prometheus gauges.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from torchprof_args.shared.metrics_log import MetricsRecord, RunSegment

__all__ = ["CATEGORIES", "LOAD_TIMERS", "TIMER_CATEGORIES", "Ledger", "build_ledger"]

CATEGORIES = ("startup", "checkpoint", "data", "evaluation", "profiling", "hang", "restart", "other")
#: Timer names per category: Megatron-LM's own (``save-checkpoint``, ``batch-generator``,
#: ``evaluate`` / ``eval-time``), DeepSpeed's pipeline engine's ``batch_input``, and the plain names
#: a training loop can use with ``torchprof_args.Timers`` (``checkpoint``, ``data``, ``evaluation``).
TIMER_CATEGORIES: Mapping[str, tuple[str, ...]] = {
    "checkpoint": ("save-checkpoint", "save-checkpoint-non-persistent", "checkpoint"),
    "data": ("batch-generator", "batch_input", "data"),
    "evaluation": ("evaluate", "eval-time", "evaluation"),
}
#: Checkpoint loads: before the first step, so taken out of start-up (category ``checkpoint``).
LOAD_TIMERS = ("load-checkpoint",)
#: The profiler's running totals (``prof.stats`` through ``extra=``) and their names in the ledger.
PROFILING_TOTALS = {
    "flush": "profiler/flush_seconds_total",
    "snapshot": "profiler/snapshot_seconds_total",
    "recording": "profiler/recording_extra_seconds_total",
    "publishing": "profiler/publishing_extra_seconds_total",
}
COST_TOTAL = "profiler/cost_seconds_total"
PRODUCTIVE = "productive"
GOODPUT_VERSION = 1


@dataclasses.dataclass
class Ledger:
    """Seconds per category (``lost_s``), productive seconds and the wall time they add up to."""

    wall_s: float = 0.0
    productive_s: float = 0.0
    lost_s: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    #: the profiling entry's parts (``flush``, ``snapshot``, ``recording``, ``publishing``)
    profiling_s: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(PROFILING_TOTALS, 0.0)
    )
    #: windows the profiler skipped because publishing was behind (they cost nothing: not recorded)
    windows_skipped: int = 0
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def goodput(self) -> float | None:
        """Productive over wall time (None for an empty ledger)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        """``torchprof goodput --json`` (version 1)."""
        return {
            "version": GOODPUT_VERSION,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "goodput": self.goodput,
            "lost_s": dict(self.lost_s),
            "profiling_s": dict(self.profiling_s),
            "windows_skipped": self.windows_skipped,
            "runs": self.runs,
            "notes": self.notes,
        }


@dataclasses.dataclass
class _Piece:
    """A span of wall time ``[start, end]`` and how its seconds split by category."""

    start: float
    end: float
    split: dict[str, float]


def build_ledger(
    segments: Sequence[RunSegment],
    *,
    timers: Mapping[str, Sequence[str]] = TIMER_CATEGORIES,
    since: float | None = None,
    now: float | None = None,
) -> Ledger:
    """The ledger of ``segments`` (:func:`~torchprof_args.shared.metrics_log.read_runs`, in file order).

    ``now``: the last segment is still running (its time since its last record counts up to
    ``now``); ``since``: only wall time after it counts (each piece prorated).
    """
    ledger = Ledger()
    pieces: list[_Piece] = []
    for index, segment in enumerate(segments):
        following = segments[index + 1] if index + 1 < len(segments) else None
        open_end = now if following is None and segment.end is None else None
        pieces += _segment_pieces(segment, following, timers, ledger, open_end)
        gap_start, gap_end = segment.finish, following.start if following is not None else None
        if gap_start is not None and gap_end is not None and gap_end > gap_start:  # between the runs
            pieces.append(_Piece(gap_start, gap_end, {"restart": gap_end - gap_start}))
        ledger.runs.append(_run_summary(segment))
    for piece in pieces:
        _add(ledger, piece, since)
    categorised = ledger.productive_s + sum(ledger.lost_s.values())
    ledger.lost_s["other"] += max(0.0, ledger.wall_s - categorised)
    return ledger


def _add(ledger: Ledger, piece: _Piece, since: float | None) -> None:
    span = piece.end - piece.start
    if span <= 0:
        return
    share = 1.0 if since is None else max(0.0, min(1.0, (piece.end - since) / span))
    ledger.wall_s += span * share
    for category, seconds in piece.split.items():
        if category == PRODUCTIVE:
            ledger.productive_s += seconds * share
        elif category.startswith("profiling:"):
            ledger.profiling_s[category.split(":", 1)[1]] += seconds * share
        else:
            ledger.lost_s[category] += seconds * share


def _segment_pieces(
    segment: RunSegment,
    following: RunSegment | None,
    timers: Mapping[str, Sequence[str]],
    ledger: Ledger,
    open_end: float | None,
) -> list[_Piece]:
    """Start-up, one piece per log interval, and the tail after the last record."""
    records = segment.records
    marker = segment.marker
    if not records:
        start, finish = segment.start, open_end or segment.finish
        if start is not None and finish is not None and finish > start:
            return [_Piece(start, finish, {"startup": finish - start})]
        return []
    if marker is not None:
        previous_time, previous_iteration = marker.writer_start, marker.start_iteration
    else:
        first = records[0]
        previous_iteration = first.iteration - 1
        previous_time = first.timestamp - float(first.metrics.get("iteration-time", 0.0))
        ledger.notes.append("lines written before runs were marked: no start-up for them")
    resume = following.marker.start_iteration if following is not None and following.marker else None
    pieces: list[_Piece] = []
    load = _timer_seconds(records[0].metrics, LOAD_TIMERS, records[0].iteration - previous_iteration)
    if marker is not None and marker.process_start is not None:
        startup = max(0.0, marker.writer_start - marker.process_start)
        in_startup = min(load, startup)
        load -= in_startup
        pieces.append(
            _Piece(
                marker.process_start,
                marker.writer_start,
                {"startup": startup - in_startup, "checkpoint": in_startup},
            )
        )
    intervals = _intervals(records, previous_time, previous_iteration, timers, load)
    ledger.windows_skipped += int(records[-1].metrics.get("profiler/windows_skipped", 0))
    quiet = _quiet_step(intervals)
    pieces += [_interval_piece(interval, quiet, resume) for interval in intervals]
    walls = [interval.end - interval.start for interval in intervals]
    finish = open_end if open_end is not None else segment.finish
    last = records[-1].timestamp
    if finish is not None and finish > last:
        pieces.append(
            _tail(
                last,
                finish,
                statistics.median(walls) if walls else 0.0,
                restarted=following is not None and segment.end is None,
                running=open_end is not None,
            )
        )
    return pieces


@dataclasses.dataclass
class _Interval:
    """One log interval: its span and steps, the step timers' seconds by category, the profiler's
    measured stalls and estimated extra time (by part) in it."""

    start: float
    end: float
    iteration: int
    steps: int
    timed: dict[str, float]
    stalls: dict[str, float]
    extras: dict[str, float]

    @property
    def measured(self) -> float:
        return sum(self.timed.values()) + sum(self.stalls.values())


def _intervals(
    records: Sequence[MetricsRecord],
    start: float,
    first_iteration: int,
    timers: Mapping[str, Sequence[str]],
    load: float,
) -> list[_Interval]:
    totals = dict.fromkeys((*PROFILING_TOTALS.values(), COST_TOTAL), 0.0)
    out = []
    for record in records:
        end, iteration, metrics = record.timestamp, record.iteration, record.metrics
        steps = iteration - first_iteration
        cost = _growth(metrics, COST_TOTAL, totals)
        grown = {name: _growth(metrics, key, totals) for name, key in PROFILING_TOTALS.items()}
        if not any(key in metrics for key in PROFILING_TOTALS.values()):
            grown["flush"] = cost  # only the total (an older writer): count it as measured
        if end > start:
            timed = {
                category: _timer_seconds(metrics, names, max(steps, 0)) for category, names in timers.items()
            }
            timed["checkpoint"] = timed.get("checkpoint", 0.0) + load
            load = 0.0
            out.append(
                _Interval(
                    start,
                    end,
                    iteration,
                    steps,
                    timed,
                    {k: grown[k] for k in ("flush", "snapshot")},
                    {k: grown[k] for k in ("recording", "publishing")},
                )
            )
        start, first_iteration = end, iteration
    return out


def _quiet_step(intervals: Sequence[_Interval]) -> float:
    """Seconds per step left by the timers and stalls in the intervals without estimated profiling time
    (all of them when none is without): the pace of an undisturbed step."""
    quiet = [i for i in intervals if i.steps > 0 and not any(i.extras.values())] or [
        i for i in intervals if i.steps > 0
    ]
    paces = [max(0.0, i.end - i.start - i.measured) / i.steps for i in quiet]
    return statistics.median(paces) if paces else 0.0


def _interval_piece(interval: _Interval, quiet: float, resume: int | None) -> _Piece:
    """The interval's split: the timers' categories and the profiler's stalls as measured, its
    estimated extra time no more than what is left above ``quiet`` steps (the estimate counts a
    checkpoint taken during a recorded step as slowdown too), the rest productive (or redone after a
    restart)."""
    wall, steps = interval.end - interval.start, interval.steps
    if steps <= 0:
        return _Piece(interval.start, interval.end, {"other": wall})
    parts = dict(interval.stalls)
    room = max(0.0, wall - interval.measured - steps * quiet)
    estimated = sum(interval.extras.values())
    scale = min(1.0, room / estimated) if estimated > 0 else 0.0
    parts.update({k: v * scale for k, v in interval.extras.items()})
    split = {**interval.timed, "profiling": sum(parts.values())}
    lost = sum(split.values())
    if lost > wall:  # overlapping timers: scale down to the interval
        split = {k: v * wall / lost for k, v in split.items()}
        parts = {k: v * wall / lost for k, v in parts.items()}
        lost = wall
    productive = wall - lost
    redone = 0.0
    if resume is not None and interval.iteration > resume:
        redone = productive * min(1.0, (interval.iteration - resume) / steps)
    split.update({PRODUCTIVE: productive - redone, "restart": redone})
    split.update({f"profiling:{name}": seconds for name, seconds in parts.items()})
    return _Piece(interval.start, interval.end, split)


def _tail(last_record: float, finish: float, usual: float, *, restarted: bool, running: bool) -> _Piece:
    """After the last record: up to one usual interval of steps not logged yet (productive while
    running, redone after a restart, else other), the rest hang."""
    tail = finish - last_record
    hang = max(0.0, tail - usual)
    rest = "productive" if running else "restart" if restarted else "other"
    return _Piece(last_record, finish, {"hang": hang, rest: tail - hang})


def _timer_seconds(metrics: Mapping[str, Any], names: Sequence[str], steps: int) -> float:
    seconds = 0.0
    for name in names:
        seconds += float(metrics.get(f"timers/{name}-time", 0.0) or 0.0) * steps
        seconds += float(metrics.get(f"deepspeed/{name}-ms", 0.0) or 0.0) / 1000.0 * steps
    return seconds


def _growth(metrics: Mapping[str, Any], key: str, totals: dict[str, float]) -> float:
    """How much the running total ``key`` grew since the previous record of the run."""
    value = metrics.get(key)
    if value is None:
        return 0.0
    grown = max(0.0, float(value) - totals[key])
    totals[key] = max(totals[key], float(value))
    return grown


def _run_summary(segment: RunSegment) -> dict[str, Any]:
    marker = segment.marker
    return {
        "id": marker.id if marker else None,
        "host": marker.host if marker else None,
        "pid": marker.pid if marker else None,
        "start": segment.start,
        "end": segment.finish,
        "closed": segment.end is not None,
        "start_iteration": marker.start_iteration if marker else None,
        "last_iteration": segment.records[-1].iteration if segment.records else None,
    }


_EXPLAINED = {
    "startup": "process start to the first step, less checkpoint loads",
    "checkpoint": "timers save-checkpoint, load-checkpoint, checkpoint",
    "data": "timers batch-generator, batch_input, data",
    "evaluation": "timers evaluate, eval-time, evaluation",
    "hang": "alive after the last logged interval, beyond one interval",
    "restart": "work redone after a restart, and the time between runs",
    "other": "not attributed",
}


def format_ledger(ledger: Ledger, source: str) -> str:
    """``torchprof goodput``'s text: one line per category, the profiling entry's parts."""
    wall = ledger.wall_s or 1.0
    restarts = max(0, len(ledger.runs) - 1)
    lines = [
        f"goodput of {source}: {len(ledger.runs)} run(s), {restarts} restart(s)",
        f"  {'wall time':<12s}{ledger.wall_s:10.1f} s",
        f"  {'productive':<12s}{ledger.productive_s:10.1f} s {ledger.productive_s / wall:7.1%}  goodput",
        "  lost:",
    ]
    for category in CATEGORIES:
        seconds = ledger.lost_s[category]
        why = _EXPLAINED.get(category, "")
        if category == "profiling":
            parts = ledger.profiling_s
            why = (
                f"flush stalls {parts['flush']:.2f} s, snapshots {parts['snapshot']:.2f} s, recorded steps "
                f"{parts['recording']:.2f} s, steps beside the publisher {parts['publishing']:.2f} s; "
                f"{ledger.windows_skipped} window(s) skipped"
            )
        lines.append(f"    {category:<10s}{seconds:10.1f} s {seconds / wall:7.1%}  {why}")
    lines += [f"  note: {note}" for note in dict.fromkeys(ledger.notes)]
    return "\n".join(lines)
