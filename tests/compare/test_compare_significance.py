"""t-tests, Holm's correction and the per-group rows against hand-computed and mpmath (40-digit) values."""

import csv
import math

import pytest

from tokenpo.compare.runs import Run
from tokenpo.compare.significance import (
    compare_to_baseline,
    holm_adjust,
    paired_by_seed,
    paired_t_test,
    planned_seeds,
    result,
    seeds_needed,
    significance_markdown,
    welch_t_test,
    write_significance_csv,
)


def test_welch_t_test_matches_mpmath():
    test = welch_t_test([0.5, 0.75, 0.25, 0.625], [0.25, 0.375, 0.125])
    assert test.name == "Welch (n=4 vs 3)"
    assert test.difference == pytest.approx(0.28125, abs=1e-12)
    assert test.t == pytest.approx(2.1828206253269967617, abs=1e-9)
    assert test.df == pytest.approx(4.8495960223741454319, abs=1e-9)
    assert test.p == pytest.approx(0.082512887295159887126, abs=1e-9)
    assert (test.ci_low, test.ci_high) == (
        pytest.approx(-0.053075482377497983343, abs=1e-9), pytest.approx(0.61557548237749798334, abs=1e-9))


def test_paired_t_test_matches_mpmath_and_the_df_2_closed_form():
    test = paired_t_test([0.6, 0.7, 0.55, 0.8, 0.65], [0.5, 0.62, 0.58, 0.61, 0.52])
    assert (test.name, test.df) == ("paired (n=5)", 4)
    assert test.difference == pytest.approx(0.094, abs=1e-12)
    assert test.t == pytest.approx(2.6010953046886818928, abs=1e-9)
    assert test.p == pytest.approx(0.059978960219990574040, abs=1e-9)
    assert (test.ci_low, test.ci_high) == (
        pytest.approx(-0.0063369001582313661013, abs=1e-9), pytest.approx(0.19433690015823136610, abs=1e-9))
    # differences 0.25, -0.25, 0.5: mean 1/6, std sqrt(7/48), t = (1/6) / sqrt(7/144); df 2: p = 1 - t / sqrt(2 + t^2)
    small = paired_t_test([0.75, 0.5, 0.75], [0.5, 0.75, 0.25])
    t = (1 / 6) / math.sqrt(7 / 144)
    assert small.t == pytest.approx(t, abs=1e-12) and small.p == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


def test_no_spread_gives_no_test():
    assert welch_t_test([0.5, 0.5], [0.25, 0.25]) is None
    assert paired_t_test([0.6, 0.7], [0.5, 0.6]) is None  # both pairs differ by exactly 0.1


def test_holm_adjustment_on_a_fixed_vector():
    # sorted 0.01, 0.03, 0.04 -> x3, x2, x1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], abs=1e-12)
    assert holm_adjust([0.5, 0.9]) == [1.0, 1.0]
    assert holm_adjust([]) == []


def test_pairing_needs_the_same_seeds_once_each():
    group, base = [("1", 0.5), ("0", 0.25)], [("0", 0.125), ("1", 0.375)]
    assert paired_by_seed(group, base) == ([0.25, 0.5], [0.125, 0.375])
    assert paired_by_seed(group, [("0", 0.1), ("2", 0.2)]) is None
    assert paired_by_seed([(None, 0.5), (None, 0.25)], [(None, 0.1), (None, 0.2)]) is None
    assert paired_by_seed([("0", 0.5), ("0", 0.25)], [("0", 0.1), ("0", 0.2)]) is None


def runs(algorithm, finals, seeds=None):
    """One run per final value, eval at steps 1 and 2 (step 1 at 0.9 so best != final)."""
    seeds = seeds if seeds is not None else range(len(finals))
    return [
        Run(f"{algorithm}{seed}", {"algorithm": algorithm, "seed": str(seed)},
            [{"step": 1.0, "eval/accuracy": 0.9}, {"step": 2.0, "eval/accuracy": value}])
        for seed, value in zip(seeds, finals)
    ]


def groups():
    return {
        "algorithm=base": runs("base", [0.25, 0.375, 0.125]),
        # same seeds as the baseline: paired, differences 0.5 (no spread) -> n/a
        "algorithm=flat": runs("flat", [0.75, 0.875, 0.625]),
        # seeds 5-8 the baseline did not run: Welch, the mpmath case above
        "algorithm=welch": runs("welch", [0.5, 0.75, 0.25, 0.625], seeds=[5, 6, 7, 8]),
        "algorithm=one": runs("one", [0.5]),
        # differences 0.05, 0.0625, 0.075: paired, t = 0.0625 / (0.0125 / sqrt 3) = 8.66 on 2 df
        "algorithm=paired": runs("paired", [0.3, 0.4375, 0.2]),
    }


def test_rows_pick_the_test_and_holm_correct_the_tested_ones():
    rows = {row.group: row for row in compare_to_baseline(groups(), "algorithm=base", "eval/accuracy", "final")}
    assert list(rows) == ["algorithm=flat", "algorithm=welch", "algorithm=one", "algorithm=paired"]
    assert (rows["algorithm=flat"].test, result(rows["algorithm=flat"])) == (None, "n/a: no spread (t undefined)")
    assert rows["algorithm=flat"].difference == pytest.approx(0.5, abs=1e-12)
    assert (rows["algorithm=one"].n_group, result(rows["algorithm=one"])) == (1, "n/a: 1 seed")
    welch, paired = rows["algorithm=welch"], rows["algorithm=paired"]
    assert welch.test.name == "Welch (n=4 vs 3)" and paired.test.name == "paired (n=3)"
    t = 0.0625 / (0.0125 / math.sqrt(3))
    p_paired = 1 - t / math.sqrt(2 + t * t)
    assert paired.test.p == pytest.approx(p_paired, abs=1e-12)
    # two tested rows: the smaller p (paired) x2, the larger (Welch) x1 but not below the first
    assert paired.p_holm == pytest.approx(2 * p_paired, abs=1e-12)
    assert welch.p_holm == pytest.approx(max(0.082512887295159887126, 2 * p_paired), abs=1e-9)
    assert result(paired) == "significant: higher" and result(welch) == "not significant"
    # best = max(0.9, final) = 0.9 in every run: no spread anywhere
    best = compare_to_baseline(groups(), "algorithm=base", "eval/accuracy", "best")
    assert {result(row) for row in best} == {"n/a: no spread (t undefined)", "n/a: 1 seed"}


def test_an_equivalence_margin_calls_equivalent_only_an_interval_inside_it():
    margin_groups = {
        "algorithm=base": runs("base", [0.25, 0.375, 0.125]),
        # differences +0.01, -0.005, +0.005: interval about [-0.016, +0.022], p ~0.6
        "algorithm=close": runs("close", [0.26, 0.37, 0.13]),
        "algorithm=paired": groups()["algorithm=paired"],  # [+0.031, +0.094], significant after Holm
        "algorithm=welch": groups()["algorithm=welch"],  # [-0.053, +0.616]
    }
    verdicts = {margin: {row.group: result(row) for row in compare_to_baseline(
        margin_groups, "algorithm=base", "eval/accuracy", "final", margin)} for margin in (0.05, 0.1)}
    assert verdicts[0.05] == {"algorithm=close": "equivalent within ±0.05",
                              "algorithm=paired": "significant: higher",
                              "algorithm=welch": "not significant, not shown within ±0.05"}
    assert verdicts[0.1]["algorithm=paired"] == "significant: higher, within ±0.1"
    # the same interval against a margin it does not fit in
    assert [result(row) for row in compare_to_baseline(margin_groups, "algorithm=base", "eval/accuracy", "final", 0.01)
            ][0] == "not significant, not shown within ±0.01"
    text = significance_markdown({"final": compare_to_baseline(margin_groups, "algorithm=base", "eval/accuracy",
                                                               "final", 0.05)}, "eval/accuracy", "algorithm=base")
    assert "Equivalence margin ±0.05, named before the runs" in text


def test_too_few_baseline_seeds_are_named():
    few = {"algorithm=base": runs("base", [0.25]), "algorithm=a": runs("a", [0.5]), "algorithm=b": runs("b", [0.5, 0.6])}
    rows = compare_to_baseline(few, "algorithm=base", "eval/accuracy", "final")
    assert [result(row) for row in rows] == ["n/a: 1 seed, baseline has 1 seed", "n/a: baseline has 1 seed"]
    assert all(row.p_holm is None for row in rows)


def test_markdown_and_csv_rows(tmp_path):
    tables = {"final": compare_to_baseline(groups(), "algorithm=base", "eval/accuracy", "final")}
    text = significance_markdown(tables, "eval/accuracy", "algorithm=base")
    assert "**final eval/accuracy, group − algorithm=base**" in text
    assert "| algorithm=one | 1 vs 3 | — | +0.250 | — | — | n/a: 1 seed |" in text
    assert "| algorithm=welch | 4 vs 3 | Welch (n=4 vs 3) | +0.281 [-0.053, +0.616] | 0.083 | 0.083 | not significant |" in text
    assert "| algorithm=paired | 3 vs 3 | paired (n=3) | +0.062 [+0.031, +0.094] | 0.013 | 0.026 | significant: higher |" in text
    assert "better" not in text
    write_significance_csv(tables, "eval/accuracy", "algorithm=base", tmp_path / "significance.csv")
    with (tmp_path / "significance.csv").open() as handle:
        rows = {row["group"]: row for row in csv.DictReader(handle)}
    assert rows["algorithm=one"]["p"] == "" and rows["algorithm=one"]["difference"] == "0.25"
    assert float(rows["algorithm=welch"]["df"]) == pytest.approx(4.8495960223741454319, abs=1e-9)
    assert rows["algorithm=paired"]["result"] == "significant: higher"


def test_seeds_needed_matches_the_paired_t_test_power_tables():
    # G*Power / Julious (2004): a paired t-test, two-sided 0.05, 80 % power: 10 pairs at effect 1 sd, 34 at 0.5 sd
    assert seeds_needed(1.0, 1.0, 0.025) == 10 and seeds_needed(4.0, 1.0, 0.025) == 34
    assert seeds_needed(0.01, 0.05, 0.025) == seeds_needed(1.0, 0.5, 0.025)  # only the ratio counts
    # a huge effect still needs the t quantiles on few df: 3 pairs are not enough at 3 sd (t_{0.975, 2} = 4.30)
    assert seeds_needed(1.0, 0.0, 0.025) is None and seeds_needed(1.0, 3.0, 0.025) == 4


def test_undecided_rows_say_how_many_seeds_would_decide_them(tmp_path):
    margin_groups = {"algorithm=base": runs("base", [0.25, 0.375, 0.125]),
                     "algorithm=close": runs("close", [0.26, 0.37, 0.13]),
                     "algorithm=paired": groups()["algorithm=paired"],
                     "algorithm=welch": groups()["algorithm=welch"]}
    rows = {row.group: row for row in compare_to_baseline(margin_groups, "algorithm=base", "eval/accuracy", "final",
                                                          0.05)}
    # equivalent already: nothing to plan; significant: no seeds to detect, and +0.062 is past the 0.05 margin (no
    # count: "never" in the table)
    assert planned_seeds(rows["algorithm=close"]) == (None, None)
    assert planned_seeds(rows["algorithm=paired"]) == (None, None)
    welch = rows["algorithm=welch"]
    detect, fit = planned_seeds(welch)
    # Welch: s_a^2 + s_b^2 = 0.0456 + 0.0156 (sample variances), difference 0.281, past the margin
    assert detect == seeds_needed(welch.test.unit_variance, 0.28125, 0.025) and 4 <= detect <= 10 and fit is None
    assert welch.test.unit_variance == pytest.approx(0.13671875 / 3 + 0.03125 / 2, abs=1e-12)
    text = significance_markdown({"final": list(rows.values())}, "eval/accuracy", "algorithm=base")
    assert f"| not significant, not shown within ±0.05 | {detect} to detect; never for ±0.05 |" in text
    assert "| significant: higher | never for ±0.05 |" in text and "| equivalent within ±0.05 | — |" in text
    write_significance_csv({"final": list(rows.values())}, "eval/accuracy", "algorithm=base", tmp_path / "s.csv")
    with (tmp_path / "s.csv").open() as handle:
        csv_rows = {row["group"]: row for row in csv.DictReader(handle)}
    assert (csv_rows["algorithm=welch"]["seeds_to_detect"], csv_rows["algorithm=welch"]["seeds_for_margin"]) == (
        str(detect), "")
