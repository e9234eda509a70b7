"""DAPO dynamic sampling group selection, and the O+ / O− split metrics."""

from __future__ import annotations

import random

import pytest
import torch

from tokenpo.algorithms import entropy_by_polarity, partial_batch_size, prompts_per_round, select_mixed_groups

# groups in order of appearance: 11 all 1, 4 mixed, 30 all 0, 2 mixed (interleaved), 8 mixed
REWARDS = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
GROUPS = torch.tensor([11, 11, 4, 4, 30, 30, 2, 8, 2, 8, 2])


@pytest.mark.parametrize("needed, expected", [(0, []), (1, [4]), (2, [4, 2]), (3, [4, 2, 8]), (10, [4, 2, 8])])
def test_keeps_mixed_groups_in_order_of_appearance(needed, expected):
    assert select_mixed_groups(REWARDS, GROUPS, needed) == expected


def test_never_fewer_than_requested_when_enough_exist():
    rng = random.Random(0)
    for _ in range(50):
        num_groups, size = rng.randint(1, 12), rng.randint(2, 5)
        rewards = torch.tensor([float(rng.random() < 0.5) for _ in range(num_groups * size)])
        groups = torch.arange(num_groups).repeat_interleave(size)
        mixed = {g for g in range(num_groups) if len(set(rewards[groups == g].tolist())) > 1}
        needed = rng.randint(0, num_groups)
        kept = select_mixed_groups(rewards, groups, needed)
        assert len(kept) == min(needed, len(mixed))
        assert set(kept) <= mixed and len(set(kept)) == len(kept)


def test_shaped_rewards_that_differ_count_as_mixed():
    # all wrong but different overlong penalties: mixed by reward, not by accuracy
    rewards = torch.tensor([-1.0, -1.2])
    groups = torch.tensor([0, 0])
    assert select_mixed_groups(rewards, groups, 1) == [0]
    assert select_mixed_groups((rewards > 0).float(), groups, 1) == []


def test_negative_request_is_refused():
    with pytest.raises(ValueError, match="needed must be >= 0"):
        select_mixed_groups(REWARDS, GROUPS, -1)


@pytest.mark.parametrize("prompts_per_step, oversample, world_size, expected", [
    (512, 3.0, 8, 1536),  # verl's DAPO recipe: gen_batch_size = 3 x 512
    (4, 1.0, 1, 4),
    (4, 1.5, 1, 6),
    (4, 1.5, 4, 8),  # 6, rounded up to a multiple of 4 processes
    (5, 1.1, 1, 6),  # ceil(5.5)
    (3, 1.0, 2, 4),
])
def test_prompts_per_round(prompts_per_step, oversample, world_size, expected):
    assert prompts_per_round(prompts_per_step, oversample, world_size) == expected


@pytest.mark.parametrize("mixed, parts, expected", [(7, 4, 4), (8, 4, 8), (3, 4, 0), (3, 1, 3), (0, 2, 0)])
def test_partial_batch_size_is_the_largest_even_split(mixed, parts, expected):
    assert partial_batch_size(mixed, parts) == expected


def test_entropy_by_polarity_golden():
    entropy = torch.tensor([[1.0, 3.0, 50.0], [5.0, 50.0, 50.0], [2.0, 4.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    split = entropy_by_polarity(entropy, mask, torch.tensor([True, False, True]))
    assert split == {"entropy/pos": pytest.approx(10 / 4), "entropy/neg": pytest.approx(5.0)}
    assert entropy_by_polarity(entropy, mask, torch.tensor([True, True, True])).keys() == {"entropy/pos"}
