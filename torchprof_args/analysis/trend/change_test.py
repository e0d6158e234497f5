"""A change test that knows the noise: is a run's series different from a baseline of several runs?

Two questions, both must say yes before a change is reported:

1. **Is the shift more than sampling noise?**  The Mann-Whitney U test of the run's per-step
   samples against the baseline runs' samples pooled (``scipy.stats.mannwhitneyu``: two-sided,
   normal approximation with the tie and continuity corrections; ``pip install
   'torchprof-args[trend]'``).  Steps of one run are not independent (a
   slow phase lasts several steps), so its p-value alone overstates the confidence; hence 2.
2. **Is it beyond the run-to-run noise?**  The modified z-score (Iglewicz and Hoaglin) of the run's
   *level* among the baseline runs' levels: ``0.6745 (m - median(M)) / MAD(M)``.  A run's level is a
   low quantile of its samples (:attr:`Rule.quantile`, the lower quartile; the upper where higher is
   better): on a shared machine the neighbours only ever add time to a step, so the steps nobody
   slowed move with the code and hardly with the load (measured: the runs' medians spread over 13 %
   on a loaded 2-core machine, their lower quartiles over 3.5 %; lower quantiles still, down to the
   minimum, were no steadier there: the host's load shifts even a run's best steps).  Needs at least
   :data:`MIN_RUNS_FOR_Z` baseline runs; with fewer, only the U test is applied.

A change is reported with its size (the run's level over the baseline's, in percent; the medians'
change beside it), the U test's p-value and the z-score.  :func:`false_positive_rate` applies the
same rule to random splits of the baseline runs (one run against some of the others): how often it
flags a run that is only noise.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

import numpy as np

from torchprof_args.errors import CommandError

__all__ = [
    "DEFAULT_RULE",
    "Comparison",
    "Rule",
    "compare",
    "false_positive_rate",
    "modified_z",
    "u_test_p",
]

#: Baseline runs the z-score needs (a median absolute deviation of fewer says little).
MIN_RUNS_FOR_Z = 3
#: Samples the U test needs from each side to say anything.
MIN_SAMPLES = 5
#: MAD of normal data = 0.6745 standard deviations.
_MAD_SCALE = 0.6745


@dataclasses.dataclass(frozen=True)
class Rule:
    """When a change is reported: U test ``p < alpha``, modified ``z`` beyond ``z_threshold`` and a
    size of at least ``min_change_pct``, all in the worse (or better) direction."""

    alpha: float = 0.01
    z_threshold: float = 3.5
    min_change_pct: float = 0.5
    #: the quantile of a run's samples that is its level (1 - it where higher is better)
    quantile: float = 0.25


DEFAULT_RULE = Rule()


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One run's series against the baseline; ``verdict``: ``regression``, ``improvement`` or ``same``.
    ``level`` / ``baseline_level``: the rule's quantile of the run's samples / the baseline's pooled;
    ``change_pct``: of the level; ``median_change_pct``: of the median."""

    median: float
    baseline_median: float
    level: float
    baseline_level: float
    change_pct: float
    median_change_pct: float
    p_value: float | None
    z: float | None
    samples: int
    verdict: str


def u_test_p(x: Sequence[float], y: Sequence[float]) -> float:
    """The two-sided p-value of the Mann-Whitney U test of ``x`` against ``y`` (scipy's asymptotic
    method: tie and continuity corrections; samples that are all equal give 1)."""
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        raise CommandError(
            "torchprof trend's change test needs scipy: pip install 'torchprof-args[trend]'"
        ) from None
    return float(mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").pvalue)


def modified_z(value: float, references: Sequence[float]) -> float:
    """The modified z-score of ``value`` among ``references``; the mean absolute deviation (x1.2533)
    stands in for a MAD of 0, and identical references give +-inf for any other value."""
    refs = np.asarray(references, dtype=float)
    centre = float(np.median(refs))
    mad = float(np.median(np.abs(refs - centre)))
    if mad > 0:
        return _MAD_SCALE * (value - centre) / mad
    mean_dev = float(np.mean(np.abs(refs - centre)))
    if mean_dev > 0:
        return (value - centre) / (1.2533 * mean_dev)
    return 0.0 if value == centre else math.copysign(math.inf, value - centre)


def compare(
    candidate: Sequence[float],
    baseline_runs: Sequence[Sequence[float]],
    *,
    higher_is_better: bool = False,
    rule: Rule = DEFAULT_RULE,
) -> Comparison:
    """``candidate``'s samples against the baseline runs' (each run's samples); see the module."""
    pooled = [v for run in baseline_runs for v in run]
    q = 1.0 - rule.quantile if higher_is_better else rule.quantile
    median, base = float(np.median(candidate)), float(np.median(pooled))
    level, base_level = float(np.quantile(candidate, q)), float(np.quantile(pooled, q))
    change = _percent(level, base_level)
    p = None
    if len(candidate) >= MIN_SAMPLES and len(pooled) >= MIN_SAMPLES:
        p = u_test_p(candidate, pooled)
    run_levels = [float(np.quantile(run, q)) for run in baseline_runs if len(run)]
    z = modified_z(level, run_levels) if len(run_levels) >= MIN_RUNS_FOR_Z else None
    worse = change < 0 if higher_is_better else change > 0
    significant = (
        ((p is not None and p < rule.alpha) or (p is None and z is not None))
        and (z is None or abs(z) > rule.z_threshold)
        and abs(change) >= rule.min_change_pct
    )
    if p is None and z is None:
        significant = False
    verdict = "same" if not significant else "regression" if worse else "improvement"
    return Comparison(
        median, base, level, base_level, change, _percent(median, base), p, z, len(candidate), verdict
    )


def _percent(value: float, reference: float) -> float:
    if reference:
        return (value / reference - 1.0) * 100.0
    return 0.0 if value == reference else math.copysign(math.inf, value - reference)


def false_positive_rate(
    runs: Sequence[Sequence[float]],
    *,
    higher_is_better: bool = False,
    rule: Rule = DEFAULT_RULE,
    splits: int = 200,
    seed: int = 0,
) -> tuple[int, int]:
    """``(flagged, splits)``: the rule applied to ``splits`` random splits of ``runs`` (runs that
    differ only by noise): each time one run against a random subset of at least
    :data:`MIN_RUNS_FOR_Z` of the others (all of them when there are too few)."""
    if len(runs) < 2:
        return 0, 0
    rng = random.Random(seed)
    flagged = 0
    for _ in range(splits):
        order = list(range(len(runs)))
        rng.shuffle(order)
        candidate, rest = order[0], order[1:]
        size = rng.randint(min(MIN_RUNS_FOR_Z, len(rest)), len(rest))
        result = compare(
            runs[candidate], [runs[i] for i in rest[:size]], higher_is_better=higher_is_better, rule=rule
        )
        flagged += result.verdict != "same"
    return flagged, splits
