"""Fits pooled over seeds (tokenpo.compare.pooled): runs of 4 evaluations each, too few to fit one by one, recover
known parameters when pooled; the C_mid ratio's seed-resampling interval shows a 2x faster group and not an equal
one; flat groups and unfit resamples are reported with their reason."""

import csv

import numpy as np
import pytest

from tokenpo.compare import main
from tokenpo.compare.curves import CurveParams, RunCurve, saturating_curve, speed_verdict, unfit
from tokenpo.compare.pooled import pool_groups, pooled_fit, seed_points

R0, A, B = 0.34, 0.60, 2.0
# 4 evaluations after compute 0, as a study run evaluated every 2 of 8 steps
COMPUTE = np.array([1900.0, 3900.0, 5900.0, 7900.0])
NOISE = 0.02


def run_curve(c_mid, seed, noise_seed, compute=COMPUTE, noise=NOISE, r0=R0):
    """One run: R0 at compute 0, then Eq. 1 with noise (sd `noise`) at `compute`, each seed a little off in C_mid
    and in compute (its own response lengths)."""
    rng = np.random.default_rng(noise_seed)
    spread = compute * rng.uniform(0.9, 1.1, compute.size)
    values = saturating_curve(spread, CurveParams(r0, A, B, c_mid * rng.uniform(0.9, 1.1))) + rng.normal(
        0.0, noise, compute.size)
    return RunCurve(f"run{seed}", str(seed), unfit("not fitted here", 0), np.concatenate([[0.0], spread]),
                    np.concatenate([[r0], values]))


def group(c_mid, seeds=range(5), offset=0, **kwargs):
    return [run_curve(c_mid, seed, 1000 * offset + seed, **kwargs) for seed in seeds]


def test_pooling_recovers_the_parameters_runs_too_short_to_fit_alone():
    runs = group(3000.0)
    fit = pooled_fit(seed_points(runs, 0.0))
    assert fit.n_points == 20 and fit.params is not None
    # tolerance: A within 0.03, C_mid within 20 % at noise sd 0.02 and ±10 % run-to-run C_mid
    assert fit.params.r0 == pytest.approx(R0) and fit.params.a == pytest.approx(A, abs=0.03)
    assert fit.params.c_mid == pytest.approx(3000.0, rel=0.2)
    pooled = pool_groups({"g": runs}, 0.0, None, resamples=60)["g"]
    assert pooled.note == "" and pooled.ratio is None and pooled.n_runs == 5
    assert pooled.c_mid.low < 3000.0 < pooled.c_mid.high and pooled.asymptote.low < A < pooled.asymptote.high


def test_the_c_mid_ratio_shows_a_2x_faster_group_and_not_an_equal_one():
    groups = {"base": group(4000.0), "fast": group(2000.0, offset=1), "same": group(4000.0, offset=2)}
    pooled = pool_groups(groups, 0.0, "base", resamples=60)
    fast, same = pooled["fast"].ratio, pooled["same"].ratio
    assert fast.ratio == pytest.approx(0.5, rel=0.2) and fast.high < 1.0
    assert fast.test == "seed resampling, paired (n=5), 60/60 fitted"
    assert speed_verdict(fast).endswith("× faster")
    assert same.low < 1.0 < same.high and speed_verdict(same) == "not shown either way"
    assert pooled["base"].ratio is None


def test_other_seeds_are_resampled_independently():
    pooled = pool_groups({"base": group(4000.0), "other": group(2000.0, seeds=range(5, 10), offset=1)}, 0.0, "base",
                         resamples=60)
    assert pooled["other"].ratio.test.startswith("seed resampling, unpaired (n=5), ")
    assert pooled["other"].ratio.test.endswith("/30 fitted")
    # one run: a pooled fit of its own points, with neither an interval nor a ratio interval
    one = pool_groups({"base": group(4000.0), "one": group(2000.0, seeds=[0], noise=0.005)}, 0.0, "base",
                      resamples=20)["one"]
    assert one.fit.params is not None and one.note == "under 2 runs" and one.c_mid.low is None
    assert one.ratio.test == "n/a: under 2 runs" and one.ratio.low is None


def flat_run(seed):
    """A run that never moves off R0."""
    curve = run_curve(3000.0, seed, seed)
    return RunCurve(curve.run, curve.seed, curve.fit, curve.compute, np.full(curve.values.size, R0))


def test_flat_groups_and_unfit_resamples_are_reported():
    pooled = pool_groups({"base": group(3000.0), "flat": [flat_run(seed) for seed in range(3)]}, 0.0, "base",
                         resamples=20)
    assert pooled["flat"].fit.params is None and pooled["flat"].fit.reason.startswith("flat: no gain")
    assert pooled["flat"].note == "no pooled fit" and pooled["flat"].ratio.test == "n/a: no pooled fit"
    assert speed_verdict(pooled["flat"].ratio) == "n/a: no pooled fit"
    # 2 of 5 runs learn: the pool fits, but the resamples with few of them are flat: no interval
    mixed = [flat_run(seed) for seed in range(3)] + group(3000.0, seeds=[3, 4])
    row = pool_groups({"mixed": mixed}, 0.0, None, resamples=40)["mixed"]
    assert row.fit.params is not None and row.unfit_resamples > 4
    assert row.note == f"{row.unfit_resamples}/40 resamples unfit" and row.c_mid.low is None
    assert row.c_mid.mean == row.fit.params.c_mid
    # a run without its evaluation at compute 0 is left out of the pool (it has no R0)
    no_r0 = RunCurve("x", "9", unfit("", 0), COMPUTE, np.full(COMPUTE.size, 0.5))
    assert len(seed_points(group(3000.0, seeds=[0]) + [no_r0], 0.0)) == 1
    assert pooled_fit([]).reason.startswith("no run with an evaluation at compute 0")


def test_cli_writes_the_pooled_table_and_csv(run_writer, tmp_path):
    root = tmp_path / "runs"
    for index, (algorithm, c_mid) in enumerate([("base", 4000.0)] * 3 + [("fast", 2000.0)] * 3):
        curve = run_curve(c_mid, index % 3, index)
        records = [{"step": step, "tokens/generated_total": float(c), "eval/accuracy": float(v)}
                   for step, (c, v) in enumerate(zip(curve.compute, curve.values))]
        run_writer(root / str(index), [f"algorithm={algorithm}", f"seed={index % 3}"], records)
    out = tmp_path / "out"
    assert main([str(root), "--baseline", "algorithm=base", "--fit-curves", "--out", str(out)]) == 0
    markdown = (out / "curves.md").read_text()
    assert "Pooled over seeds:" in markdown and "seed resampling, paired (n=3)" in markdown
    with (out / "curves_pooled.csv").open() as handle:
        rows = {row["group"]: row for row in csv.DictReader(handle)}
    assert rows["algorithm=fast"]["n_runs_pooled"] == "3" and rows["algorithm=fast"]["resamples"] == "200"
    assert float(rows["algorithm=fast"]["c_mid_ratio"]) == pytest.approx(0.5, rel=0.3)
    assert rows["algorithm=base"]["c_mid_ratio"] == "" and float(rows["algorithm=base"]["a"]) == pytest.approx(A, abs=0.05)
    assert (out / "curves_vs_tokens.png").is_file()
