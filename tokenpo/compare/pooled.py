"""One saturating curve per group through every seed's points (ScaleRL Eq. 1, arXiv 2510.13786), with intervals
from resampling the seeds: for runs evaluated too few times to be fitted one by one (4 points after compute 0
leave one residual degree of freedom per run, where the F-test against a flat line cannot tell most gains from 0).

Each point enters as its gain over its own run's R0; the pooled R0 is the runs' mean. A seed resample draws the
group's runs with replacement and refits; every group draws the same index sets (one seeded stream), so a group
that ran the baseline's seeds is paired with it resample by resample. Intervals: the estimate ± the Student-t
quantile on n − 1 seeds' degrees of freedom times the resamples' standard deviation (of log C_mid, of the log C_mid
ratio): with 5 seeds a percentile interval of 126 distinct resamples would be too narrow. An interval needs
MIN_FITTED_SHARE of the resamples fitted; the unfit ones are reported, never dropped silently.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from tokenpo.compare.curves import (
    RATE_MAX,
    CMidRatio,
    CurveFit,
    CurveParams,
    Interval,
    RunCurve,
    fit_gain_curve,
    fit_window,
    is_rate,
    start_value,
    unfit,
)
from tokenpo.compare.stats import CI_PROB
from tokenpo.compare.student_t import t_quantile

# seed resamples per group, and the stream they come from (fixed: the tables reproduce)
RESAMPLES = 200
BOOTSTRAP_SEED = 0
# an interval needs at least this share of its resamples fitted
MIN_FITTED_SHARE = 0.9


@dataclass(frozen=True)
class SeedPoints:
    seed: str | None
    r0: float  # the run's evaluation at compute 0
    compute: np.ndarray  # points after compute 0 (and after fit_from)
    gains: np.ndarray  # metric − r0 at those points


@dataclass(frozen=True)
class PooledGroup:
    group: str
    fit: CurveFit  # through every pooled run's points; fit.params.r0 is the runs' mean R0
    n_runs: int  # runs pooled (with an R0 and a point to fit)
    asymptote: Interval | None  # A, fitted value [resampling interval]
    c_mid: Interval | None
    ratio: CMidRatio | None  # vs the baseline's pooled C_mid; None for the baseline itself or without one
    unfit_resamples: int
    resamples: int
    note: str  # why there is no interval, "" when there is one


def seed_points(curves: list[RunCurve], fit_from: float) -> list[SeedPoints]:
    """The runs with an evaluation at compute 0 and a point after it, sorted by seed (so equal seed sets align)."""
    points = []
    for curve in curves:
        r0, keep = start_value(curve.compute, curve.values), fit_window(curve.compute, fit_from)
        if r0 is not None and keep.any():
            points.append(SeedPoints(curve.seed, r0, curve.compute[keep], curve.values[keep] - r0))
    return sorted(points, key=lambda p: (p.seed is None, p.seed or ""))


def pooled_fit(points: list[SeedPoints]) -> CurveFit:
    """Eq. 1 through the gains of every run in points, R0 their mean."""
    if not points:
        return unfit("no run with an evaluation at compute 0 and a point after it", 0)
    if not is_rate(np.concatenate([p.r0 + p.gains for p in points] + [np.array([p.r0 for p in points])])):
        return unfit(f"values outside [0, {RATE_MAX:g}]: not a rate", sum(p.gains.size for p in points))
    return fit_gain_curve(np.concatenate([p.compute for p in points]), np.concatenate([p.gains for p in points]),
                          float(np.mean([p.r0 for p in points])))


def resample_fits(points: list[SeedPoints], resamples: int) -> list[CurveParams | None]:
    """The pooled fit of each seed resample (None where unfit); index sets from the one seeded stream, each fitted
    once in sorted order (5 seeds have 126 distinct resamples)."""
    draws = np.random.default_rng(BOOTSTRAP_SEED).integers(0, len(points), size=(resamples, len(points)))
    keys = [tuple(sorted(draw)) for draw in draws]
    fits = {key: pooled_fit([points[i] for i in key]).params for key in dict.fromkeys(keys)}
    return [fits[key] for key in keys]


def resampled_interval(estimate: float, draws: list[float | None], n_seeds: int, log: bool) -> Interval | None:
    """estimate ± t(n_seeds − 1) × the draws' std (on the log scale for a positive scale), or None with fewer
    than MIN_FITTED_SHARE of the draws fitted or under 2 seeds."""
    fitted = np.array([d for d in draws if d is not None], dtype=float)
    if n_seeds < 2 or fitted.size < max(2, MIN_FITTED_SHARE * len(draws)):
        return None
    centre = math.log(estimate) if log else estimate
    half = t_quantile(CI_PROB, n_seeds - 1) * float(np.std(np.log(fitted) if log else fitted, ddof=1))
    low, high = centre - half, centre + half
    return Interval(estimate, *((math.exp(low), math.exp(high)) if log else (low, high)))


def pooled_ratio(group: PooledGroup, baseline: PooledGroup, group_draws, baseline_draws,
                 group_seeds: list[str | None], baseline_seeds: list[str | None]) -> CMidRatio:
    """C_mid(group) / C_mid(baseline) with its resampling interval: paired draws when both pooled the same seeds,
    else independent ones (then on the fewer seeds' degrees of freedom)."""
    if not (group.fit.params and baseline.fit.params):
        return CMidRatio(None, None, None, "n/a: no pooled fit")
    ratio = group.fit.params.c_mid / baseline.fit.params.c_mid
    if min(len(group_seeds), len(baseline_seeds)) < 2:
        return CMidRatio(ratio, None, None, "n/a: under 2 runs")
    paired = group_seeds == baseline_seeds and None not in group_seeds
    if not paired:  # unrelated seeds: independent draws, the group's from the second half of the stream
        group_draws = group_draws[len(group_draws) // 2:]
        baseline_draws = baseline_draws[: len(baseline_draws) // 2]
    draws = [None if g is None or b is None else g.c_mid / b.c_mid for g, b in zip(group_draws, baseline_draws)]
    n = len(group_seeds) if paired else min(len(group_seeds), len(baseline_seeds))
    interval = resampled_interval(ratio, draws, n, log=True)
    test = (f"seed resampling, {'paired' if paired else 'unpaired'} (n={n}), "
            f"{sum(d is not None for d in draws)}/{len(draws)} fitted")
    if interval is None:
        return CMidRatio(ratio, None, None, f"n/a: {test}")
    return CMidRatio(ratio, interval.low, interval.high, test)


def pool_groups(curves: dict[str, list[RunCurve]], fit_from: float, baseline: str | None,
                resamples: int = RESAMPLES) -> dict[str, PooledGroup]:
    """Every group's pooled fit, its A and C_mid with resampling intervals and, against the baseline, the C_mid
    ratio."""
    points = {label: seed_points(runs, fit_from) for label, runs in curves.items()}
    draws = {label: resample_fits(p, resamples) if len(p) >= 2 else [] for label, p in points.items()}
    pooled = {}
    for label, group_points in points.items():
        fit, n, fits = pooled_fit(group_points), len(group_points), draws[label]
        unfit_draws = sum(d is None for d in fits)
        asymptote = c_mid = None
        note = "no pooled fit"
        if fit.params:
            asymptote = resampled_interval(fit.params.a, [d and d.a for d in fits], n, log=False)
            c_mid = resampled_interval(fit.params.c_mid, [d and d.c_mid for d in fits], n, log=True)
            note = "" if asymptote else "under 2 runs" if n < 2 else f"{unfit_draws}/{len(fits)} resamples unfit"
            asymptote = asymptote or Interval(fit.params.a, None, None)
            c_mid = c_mid or Interval(fit.params.c_mid, None, None)
        pooled[label] = PooledGroup(label, fit, n, asymptote, c_mid, None, unfit_draws, len(fits), note)
    if baseline in pooled:
        base = pooled[baseline]
        base_seeds = [p.seed for p in points[baseline]]
        for label, row in pooled.items():
            if label != baseline:
                ratio = pooled_ratio(row, base, draws[label], draws[baseline], [p.seed for p in points[label]],
                                     base_seeds)
                pooled[label] = dataclasses.replace(row, ratio=ratio)
    return pooled
