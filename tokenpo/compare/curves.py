"""Saturating compute–performance curves (ScaleRL: Khatri et al. 2025, "The Art of Scaling Reinforcement Learning
Compute for LLMs", arXiv 2510.13786, Eq. 1 in Sec. 2.1) fitted to each run's held-out metric against generated tokens
or wall-clock time, summarised per group over its seeds, with the ratio of C_mid to the baseline's and the compute to
reach a target.

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)

R0: the metric before training, taken from the run's evaluation at compute 0 (the paper's R0 is the initial pass rate,
not a fitted parameter); A: the asymptote; B > 0: the efficiency (steepness in log C); C_mid: the compute at which half
of the gain A − R0 is reached. The paper fits only after its first ~1.5k GPU-hours (Sec. 2.1); that window is in
GPU-hours and has no tokens or seconds equivalent, so here every point is fitted unless --fit-from names a start.
numpy only (no scipy): Levenberg–Marquardt on (A − R0, log B, log C_mid) from a grid of starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tokenpo.compare.runs import Run
from tokenpo.compare.significance import SEED_KEY, baseline_test
from tokenpo.compare.stats import first_reaching, mean_and_ci95, series
from tokenpo.compare.student_t import regularized_incomplete_beta

# the fitted metrics are rates (accuracy, pass@k, mean@n): the asymptote cannot pass 1
RATE_MAX = 1.0
# the curve's parameters A, B, C_mid; a fit needs at least one point more than these
N_PARAMS = 3
# bounds on B and on C_mid (as a factor beyond the measured compute range); a fit that ends on one is unfit
B_BOUNDS = (0.05, 50.0)
C_MID_BEYOND = 1e3
# starts: every B with every C_mid at evenly spaced log-compute points across the measured range
START_B = (0.5, 1.0, 2.0, 4.0)
START_C_MID_POINTS = 5
MAX_ITERATIONS = 500
# an accepted step that lowers the squared error by less than this fraction ends the search (converged): MINPACK's
# default ftol (scipy.optimize.leastsq); 1e-12 left a search crawling along a flat valley in B (a rise between two
# evaluations fixes C_mid, not how sharp the rise is) unconverged after 500 iterations at the same minimum from
# every start (the TEPO convergence study's pooled fits, docs/records/results.md)
RELATIVE_TOLERANCE = 1.49012e-8
# Marquardt's damping: start, factor per rejected (accepted) step, and the value past which no step lowers the error
DAMPING_START, DAMPING_FACTOR, DAMPING_MAX = 1e-3, 10.0, 1e12
# a fit whose F-test against no gain (R = R0 everywhere) has p at or above this is flat
FLAT_ALPHA = 0.05
# a log-parameter this close to its bound counts as on it
ON_BOUND = 1e-6


@dataclass(frozen=True)
class CurveParams:
    r0: float  # metric at compute 0 (measured, not fitted)
    a: float  # asymptote
    b: float  # efficiency
    c_mid: float  # compute at half the gain, in the compute axis' unit (tokens or seconds)


@dataclass(frozen=True)
class CurveFit:
    params: CurveParams | None  # None when unfit
    reason: str  # why unfit; "" for a fit
    n_points: int  # points fitted (after compute 0 and --fit-from)
    rmse: float | None = None  # root mean squared residual of the fit
    converged_starts: int = 0  # of the starts whose search converged
    starts: int = 0
    iterations: int = 0  # of the best start


@dataclass(frozen=True)
class Minimum:
    theta: np.ndarray
    sse: float
    iterations: int
    converged: bool


def saturating_curve(compute, params: CurveParams) -> np.ndarray:
    """Eq. 1 of arXiv 2510.13786: R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B); R0 at C = 0."""
    return params.r0 + (params.a - params.r0) * half_gain_fraction(
        np.asarray(compute, dtype=float), math.log(params.b), math.log(params.c_mid)
    )


def half_gain_fraction(compute: np.ndarray, log_b: float, log_c_mid: float) -> np.ndarray:
    """1 / (1 + (C_mid / C)^B), the fraction of the gain reached at C, as the logistic of z = B (log C − log C_mid)
    (0.5 + 0.5 tanh(z / 2): no overflow for far-off C; 0 at C = 0)."""
    with np.errstate(divide="ignore"):
        z = math.exp(log_b) * (np.log(compute) - log_c_mid)
    return 0.5 + 0.5 * np.tanh(0.5 * z)


def residuals_and_jacobian(theta: np.ndarray, compute: np.ndarray, gains: np.ndarray):
    """Residuals gains − G·f(C) of theta = (G = A − R0, log B, log C_mid) and their Jacobian (one row per point)."""
    gain, log_b, log_c_mid = theta
    fraction = half_gain_fraction(compute, log_b, log_c_mid)
    slope = fraction * (1.0 - fraction)  # df/dz
    z = math.exp(log_b) * (np.log(compute) - log_c_mid)
    jacobian = np.stack([-fraction, -gain * slope * z, gain * slope * math.exp(log_b)], axis=1)
    return gains - gain * fraction, jacobian


def levenberg_marquardt(theta: np.ndarray, compute: np.ndarray, gains: np.ndarray, lower: np.ndarray,
                        upper: np.ndarray) -> Minimum:
    """Least squares from theta by Levenberg–Marquardt with Marquardt's diagonal scaling; steps are clipped into
    [lower, upper]. Converged: an exact fit, an accepted step that no longer lowers the error (relative
    RELATIVE_TOLERANCE), or no step that lowers it at any damping (a minimum, possibly on a bound)."""
    residuals, jacobian = residuals_and_jacobian(theta, compute, gains)
    sse, damping = float(residuals @ residuals), DAMPING_START
    scale = float(gains @ gains) or 1.0
    for iteration in range(1, MAX_ITERATIONS + 1):
        if sse <= 1e-30 * scale:
            return Minimum(theta, sse, iteration, True)
        normal = jacobian.T @ jacobian
        gradient = jacobian.T @ residuals
        diagonal = np.maximum(np.diag(normal), 1e-12 * max(float(np.trace(normal)), 1e-300))
        while True:
            try:
                step = np.linalg.solve(normal + damping * np.diag(diagonal), gradient)
            except np.linalg.LinAlgError:
                step = None
            if step is not None:
                candidate = np.clip(theta - step, lower, upper)
                new_residuals, new_jacobian = residuals_and_jacobian(candidate, compute, gains)
                new_sse = float(new_residuals @ new_residuals)
                if np.isfinite(new_sse) and new_sse < sse:
                    break
            damping *= DAMPING_FACTOR
            if damping > DAMPING_MAX:
                return Minimum(theta, sse, iteration, True)
        decrease = sse - new_sse
        theta, residuals, jacobian, sse = candidate, new_residuals, new_jacobian, new_sse
        damping = max(damping / DAMPING_FACTOR, 1e-15)
        if decrease <= RELATIVE_TOLERANCE * (sse + 1e-30 * scale):
            return Minimum(theta, sse, iteration, True)
    return Minimum(theta, sse, MAX_ITERATIONS, False)


def projected_gain(compute: np.ndarray, gains: np.ndarray, log_b: float, log_c_mid: float) -> float:
    """The least-squares G for fixed (B, C_mid): the curve is linear in G, so G = Σ f·y / Σ f² (a start's G)."""
    fraction = half_gain_fraction(compute, log_b, log_c_mid)
    return float(fraction @ gains / max(float(fraction @ fraction), 1e-300))


def unfit(reason: str, n_points: int, **search) -> CurveFit:
    return CurveFit(None, reason, n_points, **search)


def fit_window(compute: np.ndarray, fit_from: float) -> np.ndarray:
    """The points a fit uses: compute > max(0, fit_from) (compute 0 is R0's point, never fitted)."""
    return compute > max(0.0, fit_from)


def is_rate(values: np.ndarray) -> bool:
    return bool(np.all((values >= 0.0) & (values <= RATE_MAX)))


def start_value(compute: np.ndarray, values: np.ndarray) -> float | None:
    """R0: the run's (last) evaluation at compute 0, None when it has none."""
    at_start = values[compute == 0.0]
    return float(at_start[-1]) if at_start.size else None


def fit_saturating_curve(compute, values, r0: float, fit_from: float = 0.0) -> CurveFit:
    """Eq. 1 fitted to the points with compute > max(0, fit_from), R0 fixed. Unfit (with its reason) for too few
    points, values outside [0, 1], no converged start, no gain or a gain not distinguishable from 0 (flat), or a
    parameter that ends on its bound (A above 1, B or C_mid at theirs)."""
    compute, values = np.asarray(compute, dtype=float), np.asarray(values, dtype=float)
    keep = fit_window(compute, fit_from)
    compute, values = compute[keep], values[keep]
    if not (0.0 <= r0 <= RATE_MAX and is_rate(values)):
        return unfit(f"values outside [0, {RATE_MAX:g}]: not a rate", compute.size)
    return fit_gain_curve(compute, values - r0, r0)


def fit_gain_curve(compute: np.ndarray, gains: np.ndarray, r0: float) -> CurveFit:
    """Eq. 1 in gain form, gains = R(C) − R0 at compute > 0, for one run (R0 its own) or pooled over runs (each
    point's gain over its own run's R0, r0 the runs' mean): the search from every start and the checks of
    fit_saturating_curve."""
    n = compute.size
    if n < N_PARAMS + 1:
        return unfit(f"too few points: {n} after compute 0 (need {N_PARAMS + 1}: A, B, C_mid and one more)", n)
    log_c = np.log(compute)
    lower = np.array([-np.inf, math.log(B_BOUNDS[0]), log_c.min() - math.log(C_MID_BEYOND)])
    upper = np.array([np.inf, math.log(B_BOUNDS[1]), log_c.max() + math.log(C_MID_BEYOND)])
    minima = []
    for b in START_B:
        for log_c_mid in np.linspace(log_c.min(), log_c.max(), START_C_MID_POINTS):
            gain = projected_gain(compute, gains, math.log(b), log_c_mid)
            minima.append(levenberg_marquardt(np.array([gain, math.log(b), log_c_mid]), compute, gains, lower, upper))
    converged = [minimum for minimum in minima if minimum.converged]
    if not converged:
        # a search that runs out of iterations is mostly one crawling along a bound (a step between two points
        # drives B to its upper bound, C_mid then free between them): name the bound the best start reached
        closest = min(minima, key=lambda minimum: minimum.sse)
        bound = parameter_on_bound(closest.theta, lower, upper)
        return unfit(f"optimiser did not converge from any of {len(minima)} starts"
                     + (f" (the best ends with {bound})" if bound else ""), n, starts=len(minima))
    best = min(converged, key=lambda minimum: minimum.sse)
    search = dict(rmse=math.sqrt(best.sse / n), converged_starts=len(converged), starts=len(minima),
                  iterations=best.iterations)
    gain, log_b, log_c_mid = best.theta
    if gain <= 0.0:
        return unfit(f"flat: no gain (A − R0 = {gain:.3g} ≤ 0)", n, **search)
    p_flat = no_gain_p(float(gains @ gains), best.sse, n)
    if p_flat >= FLAT_ALPHA:
        return unfit(f"flat: gain A − R0 = {gain:.3g} not distinguishable from 0 (F-test against R = R0, "
                     f"p = {p_flat:.2g})", n, **search)
    if r0 + gain > RATE_MAX:
        return unfit(f"A = {r0 + gain:.3f} above {RATE_MAX:g}: the points show no saturation", n, **search)
    bound = parameter_on_bound(best.theta, lower, upper)
    if bound:
        return unfit(bound, n, **search)
    return CurveFit(CurveParams(r0, float(r0 + gain), math.exp(log_b), math.exp(log_c_mid)), "", n, **search)


def parameter_on_bound(theta: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> str | None:
    """'<name> = <value> at its bound [low, high]' for the first of B, C_mid within ON_BOUND of a bound, else None."""
    for name, index in (("B", 1), ("C_mid", 2)):
        if min(abs(theta[index] - lower[index]), abs(theta[index] - upper[index])) < ON_BOUND:
            return (f"{name} = {math.exp(theta[index]):.4g} at its bound "
                    f"[{math.exp(lower[index]):.4g}, {math.exp(upper[index]):.4g}]")
    return None


def no_gain_p(sse_flat: float, sse: float, n: int) -> float:
    """p of the F-test of the curve against no gain (R = R0 at every point): F = ((SSE_0 − SSE) / 3) / (SSE / (n − 3))
    on (3, n − 3) df, P(F' ≥ F) = 1 − I_x(3/2, (n − 3)/2) with x = 3F / (3F + n − 3); 0 for an exact fit."""
    if sse <= 0.0:
        return 0.0 if sse_flat > 0.0 else 1.0
    f = max(sse_flat - sse, 0.0) / N_PARAMS / (sse / (n - N_PARAMS))
    x = N_PARAMS * f / (N_PARAMS * f + n - N_PARAMS)
    return 1.0 - regularized_incomplete_beta(x, N_PARAMS / 2, (n - N_PARAMS) / 2)


@dataclass(frozen=True)
class RunCurve:
    run: str  # run dir
    seed: str | None
    fit: CurveFit
    compute: np.ndarray  # the run's measured points (compute 0 included)
    values: np.ndarray


def sampled_before_update(metric: str) -> bool:
    """A step's own metric (accuracy/drawn, reward/*): it is measured on rollouts the policy sampled before the
    step's update, so it belongs at the compute spent before that policy, not at the step's end."""
    from tokenpo.metrics_registry import STEP, entry

    found = entry(metric)
    return found is not None and found.kind == STEP


def series_at_sampling(records: list[dict[str, float]], metric: str, compute_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(compute, metric) of a step's own metric, each at the compute the run had spent when the policy that sampled
    the step's rollouts was current: the end of step r − 1 − staleness (0 before the first step), so step 1 gives R0,
    the untrained policy's value at compute 0."""
    spent = {0: 0.0}
    spent.update({int(record["step"]): record[compute_key] for record in records if compute_key in record})
    pairs = []
    for record in records:
        if metric in record and "step" in record:
            version = int(record["step"]) - 1 - round(record.get("async/staleness", 0.0))
            if version in spent:
                pairs.append((spent[version], record[metric]))
    pairs.sort()
    return np.array([x for x, _ in pairs], dtype=float), np.array([y for _, y in pairs], dtype=float)


def fit_run(run: Run, metric: str, compute_key: str, fit_from: float) -> RunCurve:
    """A run's curve; R0 from its evaluation at compute 0 (the trainer's before-training evaluation), or for a
    step's own metric its first step (`series_at_sampling`)."""
    compute, values = (series_at_sampling(run.records, metric, compute_key) if sampled_before_update(metric)
                       else series(run.records, metric, compute_key))
    seed = run.overrides.get(SEED_KEY)
    r0 = start_value(compute, values)
    if r0 is None:
        fit = unfit(f"no {metric} at {compute_key} = 0 for R0 (run with eval.before_training)", 0)
    else:
        fit = fit_saturating_curve(compute, values, r0, fit_from)
    return RunCurve(str(run.path), seed, fit, compute, values)


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float | None  # 95 % Student-t interval; None for a single value
    high: float | None


def t_interval(values) -> Interval | None:
    mean, low, high = mean_and_ci95(values)
    return None if mean is None else Interval(mean, low, high)


def log_t_interval(values) -> Interval | None:
    """Geometric mean with the exponentiated t-interval of the mean log (compute is a positive scale)."""
    interval = t_interval(np.log(values))
    if interval is None:
        return None
    return Interval(*(None if x is None else math.exp(x) for x in (interval.mean, interval.low, interval.high)))


@dataclass(frozen=True)
class CMidRatio:
    ratio: float | None  # geometric-mean C_mid of the group / the baseline's; < 1: reaches half its gain sooner
    low: float | None  # exponentiated 95 % t-interval of the log difference
    high: float | None
    test: str  # "paired (n=3)" / "Welch (n=3 vs 4)", or why there is none


def c_mid_ratio(group: list[RunCurve], baseline: list[RunCurve]) -> CMidRatio:
    """A t-interval on log C_mid(group) − log C_mid(baseline) over the per-seed fits: paired on seeds when both
    fitted the same seeds, else Welch (the significance tables' rule, significance.baseline_test)."""
    logs = [[(curve.seed, math.log(curve.fit.params.c_mid)) for curve in curves if curve.fit.params]
            for curves in (group, baseline)]
    if not all(logs):
        return CMidRatio(None, None, None, "n/a: no fit")
    test, note = baseline_test(*logs)
    difference = float(np.mean([v for _, v in logs[0]]) - np.mean([v for _, v in logs[1]]))
    if test is None:
        return CMidRatio(math.exp(difference), None, None, note)
    return CMidRatio(math.exp(difference), math.exp(test.ci_low), math.exp(test.ci_high), test.name)


def speed_verdict(ratio: CMidRatio | None) -> str:
    """"k× faster" (or slower) only when the interval of the C_mid ratio excludes 1."""
    if ratio is None:
        return "baseline"
    if ratio.low is None:
        return ratio.test if ratio.test.startswith("n/a") else "n/a"
    if ratio.high < 1.0:
        return f"{1.0 / ratio.ratio:.2f}× faster"
    if ratio.low > 1.0:
        return f"{ratio.ratio:.2f}× slower"
    return "not shown either way"


def seeds_to_tell(ratio: CMidRatio | None, n_seeds: int) -> int | None:
    """Seeds per group at which a C_mid ratio of the observed size would have an interval just excluding 1, where
    this one does not: the interval's half-width on the log scale shrinks as 1/sqrt(seeds), so
    n × (half-width / |log ratio|)² (a planning figure: the t quantile's own shrinking is left out). None where
    the interval excludes 1 already, or there is none."""
    if ratio is None or ratio.low is None or ratio.ratio is None or ratio.high < 1.0 or ratio.low > 1.0:
        return None
    half = (math.log(ratio.high) - math.log(ratio.low)) / 2
    distance = abs(math.log(ratio.ratio))
    return math.ceil(n_seeds * (half / distance) ** 2) if distance > 0 else None


@dataclass(frozen=True)
class TargetReach:
    n_runs: int  # runs that logged the metric with the compute axis
    n_reached: int
    compute: Interval | None  # mean [95 % t-interval] of the compute at the first measured point ≥ target, reachers
    median: float | None


def compute_to_target(runs: list[Run], metric: str, compute_key: str, target: float) -> TargetReach:
    """The compute at each run's first measured point with metric ≥ target (measured, not fitted: no extrapolation
    beyond the last evaluation); runs that never reach it are counted, not averaged."""
    logged = [run for run in runs if series(run.records, metric, compute_key)[0].size]
    hits = [hit[compute_key] for run in logged
            if (hit := first_reaching([r for r in run.records if compute_key in r], metric, target))]
    return TargetReach(len(logged), len(hits), t_interval(hits), float(np.median(hits)) if hits else None)


@dataclass(frozen=True)
class GroupCurves:
    group: str
    metric: str
    runs: list[RunCurve]
    asymptote: Interval | None  # A over the fitted runs
    efficiency: Interval | None  # B
    c_mid: Interval | None  # geometric mean and interval of C_mid
    ratio: CMidRatio | None  # vs the baseline; None for the baseline itself or without one
    target: TargetReach | None  # for the target metric only

    @property
    def fitted(self) -> list[CurveParams]:
        return [curve.fit.params for curve in self.runs if curve.fit.params]


def fit_groups(groups: dict[str, list[Run]], metric: str, compute_key: str, fit_from: float, baseline: str | None,
               target: float | None) -> list[GroupCurves]:
    """Per-seed fits of every group, their t-intervals, the C_mid ratio to the baseline and (with a target) the
    compute to reach it."""
    curves = {label: [fit_run(run, metric, compute_key, fit_from) for run in runs] for label, runs in groups.items()}
    rows = []
    for label, runs in curves.items():
        fitted = [curve.fit.params for curve in runs if curve.fit.params]
        ratio = c_mid_ratio(runs, curves[baseline]) if baseline and label != baseline else None
        reach = None if target is None else compute_to_target(groups[label], metric, compute_key, target)
        rows.append(GroupCurves(
            label, metric, runs, t_interval([p.a for p in fitted]), t_interval([p.b for p in fitted]),
            log_t_interval([p.c_mid for p in fitted]), ratio, reach,
        ))
    return rows
