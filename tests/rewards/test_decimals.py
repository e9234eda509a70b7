"""Issue 23 item 5: a rounded decimal is not paid against an exact gold unless reward.decimal_tolerance allows it."""

import json
from pathlib import Path

import pytest

from tokenpo.data.answers import gsm8k_final_answer
from tokenpo.errors import ConfigError
from tokenpo.rewards import CORRECT, WRONG, AnswerSpec, judge, reward_config_from_dict

EXPRESSION = {"answer_format": "expression"}
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"real benchmark files absent ({SHARED_DATA})")


def expression_verdict(answer: str, gold: str, tolerance=None) -> str:
    return judge(f"\\boxed{{{answer}}}", gold, AnswerSpec(decimal_tolerance=tolerance, **EXPRESSION))


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("0.333333", r"\frac{1}{3}"),  # 6 places: math-verify's rounding alone would pay it
        ("0.3333333", "1/3"),  # 7 places
        ("0.666667", r"\frac{2}{3}"),
        ("1.414214", r"\sqrt{2}"),
        ("0.707107", r"\frac{\sqrt{2}}{2}"),
        ("3.141593", r"\pi"),
        ("1.570796", r"\frac{\pi}{2}"),
        ("(3, 1.570796)", r"\left( 3, \frac{\pi}{2} \right)"),
        ("0.333333x", r"\frac{x}{3}"),
        ("999.9999999", "1000"),
    ],
)
def test_rounded_decimals_of_exact_golds_are_refused_by_default(answer, gold):
    assert expression_verdict(answer, gold) == WRONG
    assert expression_verdict(answer, gold, tolerance=0) == WRONG  # 0 reads as null: exact only


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("0.5", r"\frac{1}{2}"),  # terminating decimals equal to the fraction
        ("0.75", "3/4"),
        ("2.50", r"\frac{5}{2}"),
        ("18.0", "18"),
        ("0.125", r"\frac{1}{8}"),
        ("(0.5, 0.25)", r"\left(\frac{1}{2}, \frac{1}{4}\right)"),
        ("0.25x", "x/4"),
        (r"\frac{1}{3}", "1/3"),  # exact answers are untouched
        ("1.6", "1.6"),  # a decimal gold still meets its own decimal
    ],
)
def test_exact_decimals_still_match(answer, gold):
    assert expression_verdict(answer, gold) == CORRECT


@pytest.mark.parametrize(
    "answer, gold, tolerance, expected",
    [
        ("0.333333", "1/3", 5e-7, CORRECT),  # |diff| = 3.3e-7
        ("0.33333", "1/3", 5e-7, WRONG),  # |diff| = 3.3e-6
        ("0.33333", "1/3", 4e-6, CORRECT),
        ("0.333", "1/3", 1e-3, CORRECT),  # a tolerance wider than math-verify's 6 places is honoured too
        ("0.333", "1/3", 3e-4, WRONG),
        ("1.414214", r"\sqrt{2}", 1e-6, CORRECT),
        ("1.414", r"\sqrt{2}", 1e-6, WRONG),
        ("(3, 1.570796)", r"\left( 3, \frac{\pi}{2} \right)", 1e-6, CORRECT),
        ("(3.5, 1.570796)", r"\left( 3, \frac{\pi}{2} \right)", 1e-6, WRONG),
        ("0.333333x", r"\frac{x}{3}", 1e-3, WRONG),  # only numbers (and tuples of them) are measured
    ],
)
def test_tolerance_boundary(answer, gold, tolerance, expected):
    assert expression_verdict(answer, gold, tolerance) == expected


@pytest.mark.parametrize("value", [-1e-6, float("inf"), float("nan"), "small", True])
def test_bad_tolerance_names_the_key(value):
    with pytest.raises(ConfigError, match=r"^reward\.decimal_tolerance must be"):
        reward_config_from_dict({"decimal_tolerance": value})


def test_scorer_workers_apply_the_tolerance():
    from tokenpo.rewards import RewardScorer, resolve

    def scored(tolerance):
        cfg = resolve(reward_config_from_dict({"decimal_tolerance": tolerance, "num_workers": 1}), EXPRESSION)
        with RewardScorer(cfg) as scorer:
            return scorer.score([r"\boxed{0.333333}", r"\boxed{0.5}"], ["1/3", "1/2"])

    assert scored(None) == [WRONG, CORRECT]
    assert scored(1e-6) == [CORRECT, CORRECT]


@needs_shared_data
def test_every_math500_gold_matches_itself():
    golds = [json.loads(line)["answer"] for line in (SHARED_DATA / "math500.jsonl").read_text().splitlines()]
    assert len(golds) == 500
    assert [gold for gold in golds if expression_verdict(gold, gold) != CORRECT] == []


@needs_shared_data
def test_gsm8k_gold_forms_score_under_both_formats():
    rows = [json.loads(line) for line in (SHARED_DATA / "gsm8k_test.jsonl").read_text().splitlines()]
    golds = [gsm8k_final_answer(row["answer"]) for row in rows]
    assert len(golds) == 1319
    for gold in golds:
        assert judge(f"\\boxed{{{gold}}}", gold, AnswerSpec()) == CORRECT  # auto: number
        assert judge(f"The answer is \\boxed{{{float(gold):.2f}}}.", gold, AnswerSpec()) == CORRECT
    for gold in golds[::10]:
        assert expression_verdict(gold, gold) == CORRECT
        assert expression_verdict(f"{float(gold):.2f}", gold) == CORRECT
