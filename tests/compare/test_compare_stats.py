import math
import statistics

import numpy as np
import pytest

from tokenpo.compare.stats import (
    align_on_step,
    ci95_half_width,
    first_reaching,
    mean_and_ci95,
    mean_and_std,
    mean_at_steps,
    ratio,
    reduce_band,
    sample_std,
    series,
)


def test_sample_std_is_ddof_1_and_zero_for_one_value():
    values = [0.25, 1.0, 0.5, 0.125]
    assert sample_std(values) == pytest.approx(statistics.stdev(values), rel=1e-15)
    assert sample_std([0.7]) == 0.0
    assert mean_and_std([0.25, 0.5, 0.75]) == (0.5, 0.25)
    assert mean_and_std([]) == (None, None)


def test_series_keeps_records_with_both_keys_sorted_by_x():
    records = [{"step": 3, "m": 0.3}, {"step": 1, "m": 0.1}, {"step": 2}, {"m": 9.0}]
    xs, ys = series(records, "m")
    assert xs.tolist() == [1.0, 3.0] and ys.tolist() == [0.1, 0.3]


def test_align_on_step_averages_only_runs_that_logged_the_step():
    # run A logs steps 1-3, run B steps 2-4
    run_a = (np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]))
    run_b = (np.array([2.0, 3.0, 4.0]), np.array([4.0, 6.0, 8.0]))
    steps, matrix = align_on_step([run_a, run_b])
    mean, low, high = reduce_band(matrix, "std")
    assert steps.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert mean.tolist() == [1.0, 3.0, 4.5, 8.0]
    # one run at steps 1 and 4: zero-width band; two runs: ± stdev
    assert low[0] == high[0] == 1.0 and low[3] == high[3] == 8.0
    assert high[1] - mean[1] == pytest.approx(statistics.stdev([2.0, 4.0]))
    minmax_low, minmax_high = reduce_band(matrix, "minmax")[1:]
    assert minmax_low.tolist() == [1.0, 2.0, 3.0, 8.0] and minmax_high.tolist() == [1.0, 4.0, 6.0, 8.0]


def test_ci95_is_the_student_t_interval_of_the_mean():
    # n = 5, std sqrt(0.0390625) = 0.1976..., t_{0.975, 4}: half-width 0.24540539518469471221 (mpmath, 40 digits)
    values = [0.5, 0.75, 0.25, 0.625, 0.375]
    assert ci95_half_width(values) == pytest.approx(0.24540539518469471221, abs=1e-9)
    mean, low, high = mean_and_ci95(values)
    assert (mean, low, high) == (0.5, pytest.approx(0.5 - 0.2454053951846947, abs=1e-9),
                                 pytest.approx(0.5 + 0.2454053951846947, abs=1e-9))
    # one value: no interval; none: nothing
    assert ci95_half_width([0.7]) is None and mean_and_ci95([0.7]) == (0.7, None, None)
    assert mean_and_ci95([]) == (None, None, None)


def test_ci_band_is_absent_where_one_run_logged_the_step():
    steps, matrix = align_on_step([(np.array([1.0, 2.0]), np.array([1.0, 2.0])), (np.array([2.0]), np.array([4.0]))])
    mean, low, high = reduce_band(matrix, "ci")
    assert mean.tolist() == [1.0, 3.0] and math.isnan(low[0]) and math.isnan(high[0])
    # two runs at step 2: 3 ± t_{0.975, 1} * sqrt(2) / sqrt(2) = 3 ± tan(0.475 pi)
    assert (low[1], high[1]) == (pytest.approx(3 - math.tan(0.475 * math.pi), abs=1e-9),
                                 pytest.approx(3 + math.tan(0.475 * math.pi), abs=1e-9))


def test_mean_at_steps_averages_the_runs_that_logged_each_step():
    # elapsed time per step: run A steps 0-2, run B steps 0-1 (crashed), nobody timed step 3
    run_a = (np.array([0.0, 1.0, 2.0]), np.array([0.0, 10.0, 30.0]))
    run_b = (np.array([0.0, 1.0]), np.array([0.0, 20.0]))
    times = mean_at_steps(np.array([0.0, 1.0, 2.0, 3.0]), [run_a, run_b])
    assert times[:3].tolist() == [0.0, 15.0, 30.0] and math.isnan(times[3])


def test_reduce_band_rejects_unknown_band_naming_known_ones():
    with pytest.raises(ValueError, match="unknown band .iqr.; known: ci, minmax, std"):
        reduce_band(np.zeros((1, 1)), "iqr")


def test_first_reaching_is_first_step_at_or_above_target():
    records = [{"step": 1, "acc": 0.4}, {"step": 2}, {"step": 3, "acc": 0.5}, {"step": 4, "acc": 0.9}]
    assert first_reaching(records, "acc", 0.5)["step"] == 3
    assert first_reaching(records, "acc", 0.95) is None


def test_ratio_needs_both_values():
    assert ratio(8.0, 16.0) == 0.5
    assert ratio(None, 2.0) is None and ratio(2.0, None) is None and ratio(2.0, 0.0) is None
