"""pass@k against the closed form, mean@n, the maj@n tie rule, and summarize on a hand-computed case."""

from fractions import Fraction
from math import comb

import pytest

from tokenpo.evaluation.metrics import maj_at_n, majority_index, mean_at_n, pass_at_k, summarize


def closed_form(n, c, k):
    return 1 - Fraction(comb(n - c, k), comb(n, k))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_closed_form_on_all_small_cases(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(closed_form(n, c, k)), abs=1e-12)


def test_pass_at_k_edges():
    assert pass_at_k(16, 0, 4) == 0.0
    assert pass_at_k(16, 16, 4) == 1.0
    assert pass_at_k(5, 1, 5) == 1.0  # k = n: any correct sample passes
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # pass@1 = c/n
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)


def test_pass_at_k_large_n_is_stable():
    # C(1000, 500) overflows a float; the product form does not
    assert pass_at_k(1000, 3, 500) == pytest.approx(float(closed_form(1000, 3, 500)), rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 1, 5), (4, 1, 0), (4, 5, 2), (4, -1, 2)])
def test_pass_at_k_rejects_invalid_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_at_n_is_the_mean_of_per_problem_accuracy():
    assert mean_at_n([[True, False, False, False], [True, True, True, True], [False] * 4]) == pytest.approx(5 / 12)
    with pytest.raises(ValueError):
        mean_at_n([])


def test_majority_vote_tie_goes_to_the_first_seen_answer():
    assert majority_index(["7", "8", "8", "7"]) == 0  # 2-2 tie: "7" appeared first
    assert majority_index(["8", "7", "7", "8"]) == 0
    assert majority_index([None, "9", "5", "5"]) == 2  # the clear winner, at its first position
    assert majority_index([None, None, "3", "4"]) == 2  # unparsed samples do not vote
    assert majority_index([None, None]) is None


def test_maj_at_n_scores_the_winning_answer():
    answers = [["7", "8", "8", "7"], ["5", "6", "6", None], [None, None, None, None], ["2", "2", "3", "3"]]
    correct = [[False, True, True, False], [True, False, False, False], [False] * 4, [False, False, True, True]]
    # problem 1: tie -> "7" wrong; problem 2: "6" wins, wrong; problem 3: nothing parsed; problem 4: tie -> "2" wrong
    assert maj_at_n(answers, correct) == 0.0
    correct[0] = [True, False, False, True]
    correct[1] = [False, True, True, False]
    assert maj_at_n(answers, correct) == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        maj_at_n([["1"]], [[True, False]])


def test_summarize_hand_computed():
    records = [
        {"correct": [True, False, False, True], "answers": ["4", "5", "5", "4"], "greedy_correct": True},
        {"correct": [False, False, False, False], "answers": ["1", "2", None, "2"], "greedy_correct": False},
        {"correct": [True, True, True, False], "answers": ["9", "9", "9", "8"], "greedy_correct": True},
    ]
    summary = summarize(records, ks=[1, 2, 4, 8])
    assert summary == pytest.approx({
        "num_problems": 3,
        "greedy/accuracy": 2 / 3,
        "mean@4": (2 / 4 + 0 + 3 / 4) / 3,
        "pass@1": (2 / 4 + 0 + 3 / 4) / 3,
        "pass@2": ((1 - 1 / 6) + 0 + 1) / 3,  # problem 1: 1 - C(2,2)/C(4,2); problem 3: C(1,2) = 0
        "pass@4": (1 + 0 + 1) / 3,
        "maj@4": (1 + 0 + 1) / 3,  # problem 1: "4"/"5" tie, "4" first and correct
    })
    assert "pass@8" not in summary


def test_summarize_without_greedy_or_with_unequal_samples():
    records = [{"correct": [True, False], "answers": ["1", "2"]}, {"correct": [True, True], "answers": ["3", "3"]}]
    assert "greedy/accuracy" not in summarize(records, ks=[1])
    greedy_only = [{"correct": [], "answers": [], "greedy_correct": True}]
    assert summarize(greedy_only, ks=[1]) == {"num_problems": 1, "greedy/accuracy": 1.0}
    with pytest.raises(ValueError, match=r"same number of samples, got \[1, 2\]"):
        summarize([{"correct": [True], "answers": ["1"]}, records[0]], ks=[1])


def test_gtpo_table_1_metrics_pass_at_2_and_4_of_8_samples():
    """Chen et al.'s unbiased pass@k on 8 samples per problem with 0, 1, 3 and 8 correct."""
    records = [{"correct": [i < c for i in range(8)], "answers": [None] * 8} for c in (0, 1, 3, 8)]
    summary = summarize(records, ks=[2, 4])
    # pass@2: 0, 1 - C(7,2)/C(8,2) = 7/28, 1 - C(5,2)/C(8,2) = 18/28, 1 -> 53/112
    assert summary["pass@2"] == pytest.approx(53 / 112)
    # pass@4: 0, 1 - C(7,4)/C(8,4) = 35/70, 1 - C(5,4)/C(8,4) = 65/70, 1 -> 17/28
    assert summary["pass@4"] == pytest.approx(17 / 28)
    assert summary["mean@8"] == pytest.approx((0 + 1 + 3 + 8) / 32)
    assert "pass@1" not in summary  # only the asked-for k


def test_any_list_of_k_up_to_n_gives_one_metric_each():
    records = [{"correct": [i % 4 == 0 for i in range(32)], "answers": [None] * 32}]
    summary = summarize(records, ks=[32, 2, 16, 4, 8])
    assert [key for key in summary if key.startswith("pass@")] == ["pass@2", "pass@4", "pass@8", "pass@16", "pass@32"]
    assert summary["mean@32"] == 0.25 and summary["pass@32"] == 1.0
    assert summary["pass@2"] == pytest.approx(1 - (24 * 23) / (32 * 31))  # 1 - C(24,2)/C(32,2)
