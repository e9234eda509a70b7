"""Reward shaping: correctness reward, DAPO soft overlong punishment and filtering, GTPO GROP."""

from __future__ import annotations

import pytest
import torch

from tokenpo.algorithms import shape_rewards
from tokenpo.algorithms.shaping import overlong_cache_len


def test_grpo_reward_is_one_or_zero(load_algorithm):
    correct = torch.tensor([True, False, True])
    rewards, keep, metrics = shape_rewards(
        load_algorithm("grpo"), correct, torch.tensor([3, 20, 20]), torch.tensor([False, True, True]), torch.zeros(3), 20
    )
    torch.testing.assert_close(rewards, torch.tensor([1.0, 0.0, 1.0]))
    assert keep.tolist() == [True, True, True]
    assert metrics["reward/shaped_mean"] == pytest.approx(2 / 3)
    assert (metrics["reward/shaped/pos"], metrics["reward/shaped/neg"]) == (1.0, 0.0)


def test_dapo_soft_overlong_punishment_golden(load_algorithm):
    # L_max = 20, L_cache = 0.25 · 20 = 5: free up to 15 tokens, then -1/5 per token, -1 from 20 on
    cfg = load_algorithm("dapo", shaping={"overlong_cache_frac": 0.25})
    correct = torch.tensor([True, False, True, False, True, False])
    lengths = torch.tensor([10, 15, 16, 18, 20, 25])
    rewards, keep, metrics = shape_rewards(cfg, correct, lengths, lengths >= 20, torch.zeros(6), 20)
    torch.testing.assert_close(rewards, torch.tensor([1.0, -1.0, 0.8, -1.6, 0.0, -2.0]))
    assert keep.all()
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-(0.2 + 0.6 + 1.0 + 1.0) / 6)


def test_overlong_cache_len_rounds_and_never_vanishes(load_algorithm):
    shaping = load_algorithm("dapo").shaping
    assert overlong_cache_len(shaping, 20480) == 4096  # the paper's L_cache
    assert overlong_cache_len(shaping, 512) == 102
    assert overlong_cache_len(shaping, 2) == 1


def test_overlong_filter_drops_truncated_responses(load_algorithm):
    cfg = load_algorithm("dapo", shaping={"overlong_filter": True})
    truncated = torch.tensor([False, True, False, True])
    _, keep, metrics = shape_rewards(cfg, torch.tensor([True, True, False, False]), torch.tensor([4, 8, 5, 8]), truncated, torch.zeros(4), 8)
    assert keep.tolist() == [True, False, True, False]
    assert metrics["reward/kept_frac"] == 0.5


def test_grop_golden(load_algorithm):
    cfg = load_algorithm("gtpo")
    # group 0: n/G = 3/4 >= 0.75, correct lengths 10, 20, 60: L+ = max(35, 30) = 35 -> -0.5·25/35 for 60
    # group 1: all correct, lengths 10, 90, 90, 90: L+ = max(50, 70) = 70 -> -0.5·20/70 for each 90
    # group 2: n/G = 1/2 < 0.75: not easy, no penalty
    correct = torch.tensor([True, True, True, False] + [True] * 4 + [True, False])
    lengths = torch.tensor([10, 20, 60, 100, 10, 90, 90, 90, 100, 5])
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 2)
    rewards, _, metrics = shape_rewards(cfg, correct, lengths, torch.zeros(10, dtype=torch.bool), groups, 128)
    penalty = [0.0, 0.0, -0.5 * 25 / 35, 0.0, 0.0, -0.5 * 20 / 70, -0.5 * 20 / 70, -0.5 * 20 / 70, 0.0, 0.0]
    base = [1.0 if hit else -1.0 for hit in correct.tolist()]
    torch.testing.assert_close(rewards, torch.tensor(base) + torch.tensor(penalty))
    assert metrics["reward/grop_penalized_frac"] == pytest.approx(0.4)


def test_grop_threshold_gamma1_decides_which_groups_are_easy(load_algorithm):
    # n/G = 2/3; correct lengths 10, 50: L+ = max(30, 30) = 30 -> -0.5·20/30 for 50 when easy
    args = (torch.tensor([True, True, False]), torch.tensor([10, 50, 5]), torch.zeros(3, dtype=torch.bool), torch.zeros(3), 128)
    hard, _, _ = shape_rewards(load_algorithm("gtpo", shaping={"grop_gamma1": 0.75, "grop_medium": False}), *args)
    easy, _, _ = shape_rewards(load_algorithm("gtpo", shaping={"grop_gamma1": 0.6}), *args)
    torch.testing.assert_close(hard, torch.tensor([1.0, 1.0, -1.0]))
    torch.testing.assert_close(easy, torch.tensor([1.0, 1.0 - 1 / 3, -1.0]))
    # not easy at 0.75 but n > m: medium, L+ over all lengths 10, 50, 5 = max(27.5, 21.67) -> -0.5·22.5/27.5
    medium, _, _ = shape_rewards(load_algorithm("gtpo", shaping={"grop_gamma1": 0.75}), *args)
    torch.testing.assert_close(medium, torch.tensor([1.0, 1.0 - 9 / 22, -1.0]))


# γ1 = 0.75. Group 0, easy at the boundary (n/G = 3/4 = γ1): L+ over the correct lengths 10, 20, 60 =
# max(35, 30) = 35 -> -0.5·25/35 for 60 (over all four lengths it would be 55 -> -0.5·5/55).
# Group 1, medium (n/G = 3/5 < γ1, n = 3 > m = 2): L+ over all lengths 10, 20, 40, 30, 50 = max(30, 30) = 30
# -> -0.5·10/30 for the correct 40; the wrong 50 gets nothing (over the correct lengths L+ would be 25).
# Group 2, neither (n = m = 2): nothing, however long.
GROP_CORRECT = torch.tensor([True, True, True, False] + [True, True, True, False, False] + [True, True, False, False])
GROP_LENGTHS = torch.tensor([10, 20, 60, 100] + [10, 20, 40, 30, 50] + [10, 90, 5, 5])
GROP_GROUPS = torch.tensor([0] * 4 + [1] * 5 + [2] * 4)
GROP_EASY = [0.0, 0.0, -0.5 * 25 / 35, 0.0]
GROP_MEDIUM = [0.0, 0.0, -0.5 * 10 / 30, 0.0, 0.0]
GROP_NEITHER = [0.0] * 4


@pytest.mark.parametrize(
    "medium, penalty", [(True, GROP_EASY + GROP_MEDIUM + GROP_NEITHER), (False, GROP_EASY + [0.0] * 5 + GROP_NEITHER)]
)
def test_grop_easy_medium_and_neither_golden(load_algorithm, medium, penalty):
    cfg = load_algorithm("gtpo", shaping={"grop_medium": medium})
    rewards, _, _ = shape_rewards(cfg, GROP_CORRECT, GROP_LENGTHS, torch.zeros(13, dtype=torch.bool), GROP_GROUPS, 128)
    base = torch.where(GROP_CORRECT, 1.0, -1.0)
    torch.testing.assert_close(rewards, base + torch.tensor(penalty))


def test_max_new_tokens_must_be_positive(load_algorithm):
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        shape_rewards(load_algorithm("dapo"), torch.tensor([True]), torch.tensor([1]), torch.tensor([False]), torch.zeros(1), 0)
