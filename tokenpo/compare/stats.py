"""Pure functions over metric series: aligning runs, mean and band, the first point reaching a target."""

from __future__ import annotations

import math

import numpy as np

from tokenpo.compare.student_t import t_quantile
from tokenpo.registry import Registry

# two-sided 95 % intervals: the Student-t quantile t_{0.975, df}
CI_PROB = 0.975


def sample_std(values) -> float:
    """Sample standard deviation (ddof=1); 0 for a single value, where it is undefined."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1)) if values.size >= 2 else 0.0


def mean_and_std(values) -> tuple[float | None, float | None]:
    """(mean, sample std) of the values, (None, None) when there are none."""
    if len(values) == 0:
        return None, None
    return float(np.mean(values)), sample_std(values)


def ci95_half_width(values) -> float | None:
    """Half-width of the 95 % Student-t interval of the mean, t_{0.975, n-1} * s / sqrt(n); None below 2 values."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    return t_quantile(CI_PROB, values.size - 1) * sample_std(values) / math.sqrt(values.size)


def mean_and_ci95(values) -> tuple[float | None, float | None, float | None]:
    """(mean, low, high) of the 95 % Student-t interval; low and high None below 2 values, mean None for none."""
    if len(values) == 0:
        return None, None, None
    centre, half = float(np.mean(values)), ci95_half_width(values)
    return (centre, None, None) if half is None else (centre, centre - half, centre + half)


def series(records: list[dict[str, float]], y_key: str, x_key: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """(x, y) over the records that hold both keys, sorted by x."""
    pairs = sorted((record[x_key], record[y_key]) for record in records if x_key in record and y_key in record)
    xs = np.array([x for x, _ in pairs], dtype=float)
    ys = np.array([y for _, y in pairs], dtype=float)
    return xs, ys


def align_on_step(runs_series: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(union of the runs' steps, runs x steps matrix) with NaN where a run did not log that step."""
    steps = np.unique(np.concatenate([xs for xs, _ in runs_series]))
    matrix = np.full((len(runs_series), steps.size), np.nan)
    for row, (xs, ys) in enumerate(runs_series):
        matrix[row, np.searchsorted(steps, xs)] = ys
    return steps, matrix


def mean_at_steps(steps: np.ndarray, runs_series: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Mean over the runs of a per-step value (e.g. elapsed time) at each of `steps`; NaN where no run logged it.

    The wall-clock axis puts a group's step means at its runs' mean elapsed time for that step: the line keeps
    the same points as against step, and no run stands in for times it did not reach.
    """
    logged_steps, matrix = align_on_step(runs_series)
    means = reduce_band(matrix, "minmax")[0]  # the mean line; the band is not needed here
    by_step = dict(zip(logged_steps.tolist(), means.tolist()))
    return np.array([by_step.get(step, np.nan) for step in steps.tolist()], dtype=float)


def std_band(values: np.ndarray) -> tuple[float, float]:
    centre, spread = float(values.mean()), sample_std(values)
    return centre - spread, centre + spread


def minmax_band(values: np.ndarray) -> tuple[float, float]:
    return float(values.min()), float(values.max())


def ci_band(values: np.ndarray) -> tuple[float, float]:
    """95 % Student-t interval of the mean; no band (NaN) where a single run logged the step."""
    _, low, high = mean_and_ci95(values)
    return (np.nan, np.nan) if low is None else (low, high)


# band drawn around the mean line: mean ± sample std, the min-max envelope of the runs, or the mean's 95 % t-interval
BANDS = Registry("band", {"std": std_band, "minmax": minmax_band, "ci": ci_band})


def reduce_band(matrix: np.ndarray, band: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column: (mean, band low, band high) over the runs present there; NaN where none is."""
    band_of = BANDS.get(band)
    mean, low, high = (np.full(matrix.shape[1], np.nan) for _ in range(3))
    for column in range(matrix.shape[1]):
        values = matrix[:, column][~np.isnan(matrix[:, column])]
        if values.size:
            mean[column] = values.mean()
            low[column], high[column] = band_of(values)
    return mean, low, high


def first_reaching(records: list[dict[str, float]], metric: str, target: float) -> dict[str, float] | None:
    """The first record (by step) whose metric is >= target, None if no record reaches it."""
    return next((record for record in records if record.get(metric, -np.inf) >= target), None)


def ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline
