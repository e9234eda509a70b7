"""ScaleRL's saturating curve (arXiv 2510.13786, Eq. 1): known parameters recovered from synthetic runs, unfit
cases with their reasons, C_mid ratio intervals, compute to target, and the CLI end to end."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from tokenpo.compare import main
from tokenpo.compare.curve_report import fmt_search
from tokenpo.compare.curves import (
    sampled_before_update,
    seeds_to_tell,
    series_at_sampling,
    CMidRatio,
    CurveParams,
    c_mid_ratio,
    compute_to_target,
    fit_run,
    fit_saturating_curve,
    half_gain_fraction,
    residuals_and_jacobian,
    saturating_curve,
    speed_verdict,
)
from tokenpo.compare.pooled import pooled_fit, seed_points
from tokenpo.compare.runs import Run, discover_run_dirs, load_run

TRUE = CurveParams(r0=0.2, a=0.7, b=1.5, c_mid=3e5)
# 12 evaluations from 2e4 to 3e6 generated tokens: through the midpoint into saturation
COMPUTE = np.geomspace(2e4, 3e6, 12)


def reference_curve(compute, params):
    """Eq. 1 as printed, one point at a time: R0 + (A − R0) / (1 + (C_mid / C)^B), R0 at C = 0."""
    out = []
    for c in compute:
        out.append(params.r0 if c == 0 else params.r0 + (params.a - params.r0) / (1 + (params.c_mid / c) ** params.b))
    return np.array(out)


def test_the_curve_is_eq_1_and_reaches_half_its_gain_at_c_mid():
    compute = np.array([0.0, 1e2, 3e5, 1e7, 1e12])
    assert np.allclose(saturating_curve(compute, TRUE), reference_curve(compute, TRUE), atol=1e-15)
    assert saturating_curve([TRUE.c_mid], TRUE)[0] == pytest.approx((TRUE.r0 + TRUE.a) / 2, abs=1e-15)
    # far beyond the data the fraction saturates without overflow
    assert half_gain_fraction(np.array([0.0, 1e300]), math.log(50.0), 0.0).tolist() == [0.0, 1.0]


def test_jacobian_matches_finite_differences():
    theta = np.array([0.4, math.log(1.3), math.log(2e5)])
    values = reference_curve(COMPUTE, TRUE) - TRUE.r0
    _, jacobian = residuals_and_jacobian(theta, COMPUTE, values)
    for column in range(3):
        step = np.zeros(3)
        step[column] = 1e-6
        plus, _ = residuals_and_jacobian(theta + step, COMPUTE, values)
        minus, _ = residuals_and_jacobian(theta - step, COMPUTE, values)
        assert np.allclose(jacobian[:, column], (plus - minus) / 2e-6, atol=1e-8)


def test_noise_free_curve_is_recovered():
    fit = fit_saturating_curve(COMPUTE, reference_curve(COMPUTE, TRUE), TRUE.r0)
    assert fit.reason == "" and fit.n_points == 12 and fit.converged_starts > 0
    # stated tolerance: 0.01 on A, 5 % relative on C_mid and B (recovered far tighter)
    assert fit.params.a == pytest.approx(TRUE.a, abs=1e-6)
    assert fit.params.c_mid == pytest.approx(TRUE.c_mid, rel=1e-6)
    assert fit.params.b == pytest.approx(TRUE.b, rel=1e-6)
    assert fit.params.r0 == TRUE.r0 and fit.rmse < 1e-9


def test_curve_with_small_seeded_noise_is_recovered_within_tolerance():
    rng = np.random.default_rng(0)
    for _ in range(5):
        values = reference_curve(COMPUTE, TRUE) + rng.normal(0.0, 0.005, COMPUTE.size)
        fit = fit_saturating_curve(COMPUTE, values, TRUE.r0)
        assert fit.reason == ""
        # noise sd 0.005 on 12 points: A within 0.02, C_mid within 15 %, B within 15 %
        assert fit.params.a == pytest.approx(TRUE.a, abs=0.02)
        assert fit.params.c_mid == pytest.approx(TRUE.c_mid, rel=0.15)
        assert fit.params.b == pytest.approx(TRUE.b, rel=0.15)


def test_the_start_and_points_before_fit_from_are_not_fitted():
    compute = np.concatenate([[0.0], COMPUTE])
    values = reference_curve(compute, TRUE)
    assert fit_saturating_curve(compute, values, TRUE.r0).n_points == 12
    # an early regime that does not follow the curve is left out of the fit window
    values[1:4] = 0.9
    fit = fit_saturating_curve(compute, values, TRUE.r0, fit_from=COMPUTE[2])
    assert fit.n_points == 9 and fit.params.c_mid == pytest.approx(TRUE.c_mid, rel=1e-6)


def test_flat_curves_are_unfit_with_a_reason():
    flat = fit_saturating_curve(COMPUTE, np.full(COMPUTE.size, 0.2), 0.2)
    assert flat.params is None and flat.reason.startswith("flat: no gain")
    # noise around R0 only: no gain, a gain the F-test against R = R0 cannot tell from 0, or a step between two
    # noisy points (B on its upper bound): never a fit
    rng = np.random.default_rng(1)
    for _ in range(5):
        noisy = fit_saturating_curve(COMPUTE, 0.2 + rng.normal(0.0, 0.01, COMPUTE.size), 0.2)
        assert noisy.params is None and noisy.reason.startswith(("flat:", "B = 50 at its bound")), noisy.reason
    # a falling metric has no gain either
    falling = fit_saturating_curve(COMPUTE, reference_curve(COMPUTE, CurveParams(0.5, 0.2, 1.0, 3e5)), 0.5)
    assert falling.reason.startswith("flat: no gain")


def test_too_few_points_non_rates_and_bounds_are_unfit():
    three = fit_saturating_curve(COMPUTE[:3], reference_curve(COMPUTE[:3], TRUE), TRUE.r0)
    assert three.params is None and three.reason.startswith("too few points: 3") and three.starts == 0
    assert "need 4" in three.reason
    assert fit_saturating_curve(COMPUTE, 100 * reference_curve(COMPUTE, TRUE), 20.0).reason.startswith("values outside")
    # a curve still accelerating at the last point (cubic in log compute) shows no saturation: A above 1
    share = np.log(COMPUTE / COMPUTE[0]) / np.log(COMPUTE[-1] / COMPUTE[0])
    assert fit_saturating_curve(COMPUTE, 0.2 + 0.7 * share**3, 0.2).reason.startswith("A = 1.436 above 1")
    # already at its plateau at the first point: B ends on its bound
    assert fit_saturating_curve(COMPUTE, np.full(COMPUTE.size, 0.6), 0.2).reason.startswith("B = 0.05 at its bound")


def test_a_search_that_never_converges_names_the_bound_it_crawls_along(monkeypatch):
    # a dip below R0 and then a step (a study run: held-out 0.345 at step 0, then 0.12, 0.585, 0.575, 0.47): every
    # start drives B to its upper bound first, and a search cut short there has not converged
    compute = np.array([1954.0, 3948.0, 5874.0, 7959.0])
    values = np.array([0.12, 0.585, 0.575, 0.47])
    # given its iterations, the search converges, and the F-test (one residual degree of freedom) calls it flat
    fit = fit_saturating_curve(compute, values, 0.345)
    assert fit.params is None and fit.converged_starts > 0 and fit.reason.startswith("flat: gain A − R0 = 0.192")
    monkeypatch.setattr("tokenpo.compare.curves.MAX_ITERATIONS", 4)
    fit = fit_saturating_curve(compute, values, 0.345)
    assert fit.params is None and fit.converged_starts == 0 and fit.starts == 20
    assert fit.reason == "optimiser did not converge from any of 20 starts (the best ends with B = 50 at its bound " \
        "[0.05, 50])"
    assert fmt_search(fit) == "0/20 starts converged"


def test_a_run_without_an_evaluation_at_compute_0_has_no_r0():
    records = [{"step": s, "tokens/generated_total": c, "eval/accuracy": 0.5} for s, c in enumerate(COMPUTE, 1)]
    curve = fit_run(Run("r", {"seed": "3"}, records), "eval/accuracy", "tokens/generated_total", 0.0)
    assert curve.fit.params is None and curve.seed == "3"
    assert curve.fit.reason.startswith("no eval/accuracy at tokens/generated_total = 0 for R0")


def synthetic_records(params, compute, noise_seed=None, noise=0.0):
    """A run's metrics: the before-training evaluation at compute 0, then one evaluation per step."""
    values = reference_curve(np.concatenate([[0.0], compute]), params)
    if noise_seed is not None:
        values[1:] += np.random.default_rng(noise_seed).normal(0.0, noise, compute.size)
    return [
        {"step": step, "tokens/generated_total": float(c), "time/elapsed_s": float(c) / 1000, "eval/accuracy": float(v)}
        for step, (c, v) in enumerate(zip(np.concatenate([[0.0], compute]), values))
    ]


def synthetic_group(c_mid, seeds, noise_offset=0):
    """One run per seed; C_mid varies by a few % across seeds (run-to-run spread) plus noise sd 0.003."""
    runs = []
    for seed in seeds:
        params = CurveParams(TRUE.r0, TRUE.a, TRUE.b, c_mid * (1 + 0.04 * (seed - 1)))
        records = synthetic_records(params, COMPUTE, noise_seed=100 * noise_offset + seed, noise=0.003)
        runs.append(Run(f"run{seed}", {"seed": str(seed)}, records))
    return runs


def fitted(runs):
    return [fit_run(run, "eval/accuracy", "tokens/generated_total", 0.0) for run in runs]


def test_c_mid_ratio_shows_a_2x_faster_group():
    fast, base = fitted(synthetic_group(1.5e5, [0, 1, 2])), fitted(synthetic_group(3e5, [0, 1, 2], noise_offset=1))
    ratio = c_mid_ratio(fast, base)
    assert ratio.test == "paired (n=3)"
    assert ratio.ratio == pytest.approx(0.5, rel=0.05) and ratio.high < 1.0
    assert speed_verdict(ratio).endswith("× faster") and speed_verdict(ratio).startswith(("1.9", "2.0", "2.1"))
    # seeds that differ between the groups: Welch
    assert c_mid_ratio(fast, fitted(synthetic_group(3e5, [3, 4, 5]))).test == "Welch (n=3 vs 3)"


def test_c_mid_ratio_of_identical_groups_is_not_shown_either_way():
    group, base = fitted(synthetic_group(3e5, [0, 1, 2])), fitted(synthetic_group(3e5, [0, 1, 2], noise_offset=1))
    ratio = c_mid_ratio(group, base)
    assert ratio.low < 1.0 < ratio.high
    assert speed_verdict(ratio) == "not shown either way"
    assert speed_verdict(CMidRatio(2.0, 1.5, 2.5, "paired (n=3)")) == "2.00× slower"
    # one seed per group: no interval, and the verdict says why
    one = c_mid_ratio(group[:1], base[:1])
    assert one.low is None and speed_verdict(one) == "n/a: 1 seed, baseline has 1 seed"
    assert c_mid_ratio(group, []).test == "n/a: no fit"


def test_compute_to_target_counts_runs_that_never_reach_it():
    # C_mid 1e5, 3e5 and 1e7 (the last stays below 0.45 within the measured compute)
    runs = [Run(f"r{i}", {"seed": str(i)}, synthetic_records(CurveParams(0.2, 0.7, 1.5, c_mid), COMPUTE))
            for i, c_mid in enumerate([1e5, 3e5, 1e7])]
    reach = compute_to_target(runs, "eval/accuracy", "tokens/generated_total", 0.45)
    assert (reach.n_runs, reach.n_reached) == (3, 2)
    # each reacher's first measured point at or above the target
    hits = [next(c for c, v in zip(COMPUTE, reference_curve(COMPUTE, CurveParams(0.2, 0.7, 1.5, m))) if v >= 0.45)
            for m in (1e5, 3e5)]
    assert reach.compute.mean == pytest.approx(np.mean(hits), rel=1e-12) and reach.median == pytest.approx(np.median(hits))
    assert reach.compute.low < reach.compute.mean < reach.compute.high
    none = compute_to_target(runs, "eval/accuracy", "tokens/generated_total", 0.99)
    assert (none.n_runs, none.n_reached, none.compute, none.median) == (3, 0, None, None)


@pytest.fixture
def curve_multirun(tmp_path, run_writer):
    """algorithm=fast (C_mid 1.5e5 tokens) and algorithm=base (3e5) x seeds 0-2, plus a flat run (seed 3 of base)."""
    root = tmp_path / "curves"
    index = 0
    for algorithm, c_mid in (("fast", 1.5e5), ("base", 3e5)):
        for seed, run in zip(range(3), synthetic_group(c_mid, range(3), noise_offset=int(c_mid == 3e5))):
            run_writer(root / str(index), [f"algorithm={algorithm}", f"seed={seed}"], run.records)
            index += 1
    flat = [dict(record, **{"eval/accuracy": 0.2}) for record in synthetic_records(TRUE, COMPUTE)]
    run_writer(root / str(index), ["algorithm=base", "seed=3"], flat)
    return root


def test_cli_writes_the_curve_table_and_figure(curve_multirun, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(curve_multirun), "--baseline", "algorithm=base", "--fit-curves", "--target", "0.45",
                 "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    for name in ("curves.md", "curves.csv", "curve_fits.csv", "curves_vs_tokens.png", "summary.md"):
        assert (out / name).is_file(), name
    assert (out / "curves_vs_tokens.png").stat().st_size > 15_000
    markdown = (out / "curves.md").read_text()
    assert "## Curve fits" in stdout and markdown in stdout and "curves_vs_tokens.png" in stdout
    with (out / "curves.csv").open() as handle:
        rows = {row["group"]: row for row in csv.DictReader(handle)}
    fast, base = rows["algorithm=fast"], rows["algorithm=base"]
    assert (fast["n_runs"], fast["n_fitted"], base["n_runs"], base["n_fitted"]) == ("3", "3", "4", "3")
    assert float(fast["a_mean"]) == pytest.approx(0.7, abs=0.01)
    assert float(fast["c_mid_geomean"]) == pytest.approx(1.5e5, rel=0.05)
    assert float(fast["c_mid_ratio"]) == pytest.approx(0.5, rel=0.05) and fast["speed"].endswith("× faster")
    # paired on the fitted seeds 0-2 (base's seed 3 is unfit); the flat run never reaches the target
    assert fast["ratio_test"] == "paired (n=3)" and base["speed"] == ""
    assert (base["target_n_runs"], base["target_n_reached"]) == ("4", "3")
    assert "3/4 reached" in markdown and "1 never" in markdown
    with (out / "curve_fits.csv").open() as handle:
        fits = list(csv.DictReader(handle))
    assert len(fits) == 7
    (flat,) = [row for row in fits if row["a"] == ""]
    assert flat["seed"] == "3" and flat["unfit_reason"].startswith("flat: no gain")
    assert "unfit: flat: no gain" in markdown


def test_cli_on_wall_time_and_without_before_training_evaluations(curve_multirun, multirun, tmp_path, capsys):
    out = tmp_path / "time"
    assert main([str(curve_multirun), "--fit-curves", "--compute", "time", "--no-figures", "--out", str(out)]) == 0
    assert not list(out.glob("*.png")) and (out / "curves.csv").is_file()
    with (out / "curves.csv").open() as handle:
        rows = {row["group"]: row for row in csv.DictReader(handle)}
    # 1000 tokens per second in the synthetic runs
    assert float(rows["algorithm=fast"]["c_mid_geomean"]) == pytest.approx(150.0, rel=0.05)
    # conftest's runs log no evaluation at compute 0: every run unfit with the reason, no figure, still exit 0
    other = tmp_path / "conftest"
    assert main([str(multirun), "--fit-curves", "--out", str(other)]) == 0
    markdown = (other / "curves.md").read_text()
    assert markdown.count("unfit: no eval/accuracy at tokens/generated_total = 0 for R0") == 6
    assert not (other / "curves_vs_tokens.png").exists()


def test_fit_options_need_fit_curves_and_the_default_output_is_unchanged(multirun, tmp_path, capsys):
    for argv in (["--compute", "time"], ["--fit-from", "10"], ["--fit-metric", "accuracy"],
                 ["--fit-curves", "--fit-from", "-1"]):
        with pytest.raises(SystemExit) as exit_:
            main([str(multirun), *argv])
        assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--compute needs --fit-curves" in errors[0] and "--fit-from must be >= 0" in errors[3]
    out = tmp_path / "plain"
    assert main([str(multirun), "--no-figures", "--out", str(out)]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["summary.csv", "summary.md"]
    assert "Curve fits" not in capsys.readouterr().out


def test_a_steps_own_metric_sits_at_the_compute_spent_before_the_policy_that_sampled_it():
    records = [{"step": 0, "tokens/generated_total": 0.0, "eval/accuracy": 0.3},
               {"step": 1, "tokens/generated_total": 100.0, "accuracy/drawn": 0.10},
               {"step": 2, "tokens/generated_total": 250.0, "accuracy/drawn": 0.20},
               {"step": 3, "tokens/generated_total": 330.0, "accuracy/drawn": 0.40, "async/staleness": 1.0}]
    compute, values = series_at_sampling(records, "accuracy/drawn", "tokens/generated_total")
    # step 1 was sampled by the untrained policy (compute 0: its R0), step 2 by the policy after step 1, step 3 one
    # version stale: by the policy after step 1 too
    assert compute.tolist() == [0.0, 100.0, 100.0]
    assert values.tolist() == [0.10, 0.20, 0.40]
    assert sampled_before_update("accuracy/drawn") and sampled_before_update("reward/mean")
    assert not sampled_before_update("eval/accuracy")


def test_seeds_to_tell_scales_the_interval_to_just_exclude_1():
    # ratio 0.8 with [0.6, 1.0667] at 8 seeds: half-width log(1.0667/0.6)/2 = 0.2877 = 1.289 × |log 0.8|
    ratio = CMidRatio(0.8, 0.6, 0.6 * (0.8 / 0.6) ** 2, "seed resampling, paired (n=8)")
    assert seeds_to_tell(ratio, 8) == math.ceil(8 * (math.log(0.8 / 0.6) / math.log(1 / 0.8)) ** 2) == 14
    assert seeds_to_tell(CMidRatio(0.5, 0.3, 0.8, "paired"), 8) is None  # shown already: no more seeds needed
    assert seeds_to_tell(CMidRatio(0.8, None, None, "n/a"), 8) is None


def test_the_tepo_studys_grpo_runs_pool_into_a_converged_fit(monkeypatch):
    """The committed runs whose pooled fit crawled along B for 500 iterations at the old 1e-12 tolerance, from every
    start, at one minimum (docs/records/results.md): at MINPACK's it converges there."""
    runs_dir = Path(__file__).resolve().parents[2] / "docs" / "data" / "tepo_convergence" / "runs" / "grpo"
    runs = [load_run(path) for path in discover_run_dirs([runs_dir])]
    points = seed_points([fit_run(run, "eval/accuracy", "tokens/generated_total", 0.0) for run in runs], 0.0)
    assert len(points) == 8
    fit = pooled_fit(points)
    assert fit.params is not None and fit.converged_starts == 20
    assert 500 < fit.params.c_mid < 750 and abs(fit.params.a - 0.546) < 0.01
    monkeypatch.setattr("tokenpo.compare.curves.RELATIVE_TOLERANCE", 1e-12)
    assert pooled_fit(points).reason.startswith("optimiser did not converge from any of 20 starts")
