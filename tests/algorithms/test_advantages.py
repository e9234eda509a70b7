"""Advantages: GRPO group advantage, GTPO (Eq. 3, 5, 6) and GRPO-S, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from tokenpo.algorithms import group_advantages, token_advantages
from tokenpo.algorithms.advantages import entropy_weighted_rewards

ROOT3_2 = math.sqrt(3) / 2


def test_group_advantage_golden():
    # group 3: [1, 0, 0, 1] -> mean 0.5, unbiased std 1/sqrt(3) -> ±sqrt(3)/2;
    # group 7 all equal -> 0; group 9 has one member -> 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 5.0])
    groups = torch.tensor([3, 3, 3, 3, 7, 7, 9])
    expected = torch.tensor([ROOT3_2, -ROOT3_2, -ROOT3_2, ROOT3_2, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(rewards, groups), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        group_advantages(rewards, groups, scale="none"), torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0])
    )
    with pytest.raises(ValueError, match="known: std, none"):
        group_advantages(rewards, groups, scale="mad")


def test_group_advantage_ignores_group_order_and_id_values():
    rewards = torch.tensor([2.0, 0.0, 1.0, 4.0])
    interleaved = group_advantages(rewards, torch.tensor([50, -1, 50, -1]))
    torch.testing.assert_close(interleaved[[0, 2]], group_advantages(rewards[[0, 2]], torch.tensor([0, 0])))
    torch.testing.assert_close(interleaved[[1, 3]], group_advantages(rewards[[1, 3]], torch.tensor([0, 0])))


@pytest.mark.parametrize("name", ["grpo", "dapo", "tepo", "dr_grpo", "gspo"])
def test_grpo_advantage_is_broadcast_and_zero_on_padding(load_algorithm, name):
    cfg = load_algorithm(name)
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    groups = torch.tensor([0, 0, 1, 1])
    advantages = token_advantages(cfg, rewards, rewards > 0, groups, mask)
    per_sequence = group_advantages(rewards, groups, cfg.advantage.scale)
    torch.testing.assert_close(advantages, per_sequence[:, None] * mask)
    assert advantages[2:].abs().max() == 0  # group 1's rewards are all equal


# One group: O+ = {0, 1}, O− = {2}; lengths 2, 1, 2; old entropy per token.
GTPO_REWARDS = torch.tensor([1.0, 1.0, -1.0])
GTPO_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
GTPO_ENTROPY = torch.tensor([[1.0, 2.0], [3.0, 9.0], [0.5, 2.0]])
GTPO_GROUPS = torch.tensor([0, 0, 0])


def test_gtpo_token_rewards_eq3_eq5():
    # t=0: O+ active {0 (H=1), 1 (H=3)}, d=2: bonus 0.1·(1/4)·2 = 0.05, 0.1·(3/4)·2 = 0.15
    # t=1: O+ active {0}, d=1: bonus 0.1; sequence 1 has ended and gets nothing
    # O− has one sequence, h=1: its weight is 1, penalty 0.1 at each of its tokens
    token_rewards = entropy_weighted_rewards(
        GTPO_REWARDS[:, None], GTPO_REWARDS[:, None] > 0, GTPO_GROUPS, GTPO_ENTROPY, GTPO_MASK, 1.0, 0.1, 1e-9
    )
    expected = torch.tensor([[1.05, 1.1], [1.15, 0.0], [-1.1, -1.1]])
    torch.testing.assert_close(token_rewards, expected)


def test_gtpo_bonus_splits_d_t_by_entropy_share_and_penalty_by_inverse_entropy():
    # two O− sequences active at t with H = 1 and 3: inverse shares 0.75 / 0.25 of h_t = 2
    token_rewards = entropy_weighted_rewards(
        torch.tensor([[-1.0], [-1.0]]), torch.tensor([[False], [False]]), torch.tensor([0, 0]),
        torch.tensor([[1.0], [3.0]]), torch.ones(2, 1), 1.0, 0.1, 1e-9,
    )
    torch.testing.assert_close(token_rewards, torch.tensor([[-1.0 - 0.15], [-1.0 - 0.05]]))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # joint, each response counted once: weighted mean 0.375, std 1.2780601
        ({}, [[0.528144, 0.567266], [0.606388, 0.0], [-1.154093, -1.154093]]),
        # joint, each token counted once: mean 0.22, std 1.2055082
        ({"stats_weight": "token"}, [[0.688506, 0.729983], [0.771459, 0.0], [-1.094974, -1.094974]]),
        # per polarity: O+ standardised alone; the single O− response has no spread -> 0
        ({"norm": "per_polarity"}, [[-1.066004, -0.213201], [0.639602, 0.0], [0.0, 0.0]]),
        # scale only: r̃ / joint std, the sign of correctness survives
        ({"norm": "scale_only"}, [[0.821558, 0.860679], [0.899801, 0.0], [-0.860679, -0.860679]]),
        # per polarity, padded (token weights 1/2, 1/2, 1, 1/2, 1/2; total 3):
        # r̃+ = [1.05, 1.1, 1.15, 0, 0] -> mean 2.225/3 = 0.741667, std sqrt(0.828542/2) = 0.643639;
        # r̃− = [0, 0, 0, -1.1, -1.1] -> mean -1.1/3, std sqrt(0.806667/2) = 0.635085
        ({"norm": "per_polarity_padded"}, [[0.479050, 0.556731], [0.634411, 0.0], [-1.154701, -1.154701]]),
    ],
)
def test_gtpo_advantage_eq6_golden(load_algorithm, overrides, expected):
    cfg = load_algorithm("gtpo", advantage=overrides)
    advantages = token_advantages(cfg, GTPO_REWARDS, GTPO_REWARDS > 0, GTPO_GROUPS, GTPO_MASK, GTPO_ENTROPY)
    torch.testing.assert_close(advantages, torch.tensor(expected), atol=2e-6, rtol=1e-4)  # eps=1e-6 in the std


def test_gtpo_scope_batch_pools_groups_and_scope_group_does_not(load_algorithm):
    rewards = torch.cat([GTPO_REWARDS, GTPO_REWARDS])
    mask = torch.cat([GTPO_MASK, GTPO_MASK])
    entropy = torch.cat([GTPO_ENTROPY, GTPO_ENTROPY * 2])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    single = token_advantages(load_algorithm("gtpo"), GTPO_REWARDS, GTPO_REWARDS > 0, GTPO_GROUPS, GTPO_MASK, GTPO_ENTROPY)
    by_group = token_advantages(load_algorithm("gtpo"), rewards, rewards > 0, groups, mask, entropy)
    # entropy shares are scale-free, so doubling the second group's entropy changes nothing
    torch.testing.assert_close(by_group, torch.cat([single, single]))
    # pooling both (identical) groups: same mean, spread of 6 members -> std × sqrt(2/2.5)
    by_batch = token_advantages(load_algorithm("gtpo", advantage={"scope": "batch"}), rewards, rewards > 0, groups, mask, entropy)
    torch.testing.assert_close(by_batch, torch.cat([single, single]) * math.sqrt(5 / 4), atol=1e-5, rtol=0)


# Two groups: the one above and a copy with twice the entropy (unchanged within a group, not across them).
TWO_GROUPS = dict(
    rewards=torch.cat([GTPO_REWARDS, GTPO_REWARDS]),
    groups=torch.tensor([0, 0, 0, 1, 1, 1]),
    mask=torch.cat([GTPO_MASK, GTPO_MASK]),
    entropy=torch.cat([GTPO_ENTROPY, GTPO_ENTROPY * 2]),
)
# norm scale_only with scale none leaves the token rewards r̃ of Eq. 3/5 as they are
RAW_TOKEN_REWARDS = {"norm": "scale_only", "scale": "none"}


def test_gtpo_share_scope_batch_shares_entropy_across_groups(load_algorithm):
    b = TWO_GROUPS
    args = (b["rewards"], b["rewards"] > 0, b["groups"], b["mask"], b["entropy"])
    by_group = token_advantages(load_algorithm("gtpo", advantage=RAW_TOKEN_REWARDS), *args)
    single = [[1.05, 1.1], [1.15, 0.0], [-1.1, -1.1]]
    torch.testing.assert_close(by_group, torch.tensor(single * 2), atol=1e-5, rtol=0)
    # batch: t=0 O+ H = 1, 3, 2, 6 (Σ 12, d = 4) -> 0.1·H/12·4; t=1 O+ H = 2, 4 (Σ 6, d = 2) -> 0.1·H/6·2;
    # O− 1/H at t=0: 2, 1 (Σ 3, h = 2) -> 0.1·(2/3)·2, 0.1·(1/3)·2; at t=1: 0.5, 0.25 -> the same shares
    by_batch = token_advantages(load_algorithm("gtpo", advantage={**RAW_TOKEN_REWARDS, "share_scope": "batch"}), *args)
    expected = [[1 + 0.4 / 12, 1 + 0.4 / 6], [1.1, 0.0], [-1 - 0.4 / 3, -1 - 0.4 / 3],
                [1 + 0.8 / 12, 1 + 0.8 / 6], [1.2, 0.0], [-1 - 0.2 / 3, -1 - 0.2 / 3]]
    torch.testing.assert_close(by_batch, torch.tensor(expected), atol=1e-5, rtol=0)
    # the count scales with the pool: the bonus still averages α2 per active O+ token at each t
    positive = (b["rewards"] > 0)[:, None] * b["mask"]
    bonus_per_token = ((by_batch - 1) * positive).sum(0) / positive.sum(0)
    torch.testing.assert_close(bonus_per_token, torch.tensor([0.1, 0.1]), atol=1e-5, rtol=0)


def test_grpo_s_share_scope_batch_shares_sequence_entropy_across_groups(load_algorithm):
    # Ĥ = [2, 6, 1] and [4, 12, 2]; O+ Σ Ĥ = 24, n = 4 -> 0.1·Ĥ/24·4; O− 1/Ĥ = 1, 0.5 (Σ 1.5, m = 2)
    # r̂ = [31/30, 1.1, -17/15 | 16/15, 1.2, -16/15]; scale none: minus the group means 1/3 and 0.4
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]] * 2)
    entropy = torch.tensor([[1.0, 3.0], [6.0, 100.0], [0.5, 1.5]])
    b = TWO_GROUPS
    cfg = load_algorithm("grpo_s", advantage={"share_scope": "batch", "scale": "none"})
    advantages = token_advantages(cfg, b["rewards"], b["rewards"] > 0, b["groups"], mask, torch.cat([entropy, entropy * 2]))
    sequence = torch.tensor([0.7, 23 / 30, -22 / 15, 2 / 3, 0.8, -22 / 15])
    torch.testing.assert_close(advantages, sequence[:, None] * mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("scope", ["group", "batch"])
@pytest.mark.parametrize("stats_weight", ["sequence", "token"])
def test_gtpo_per_polarity_padded_equals_joint_at_alpha2_zero(load_algorithm, scope, stats_weight):
    torch.manual_seed(1)
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0])
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    mask = (torch.arange(6)[None, :] < torch.randint(1, 7, (12,))[:, None]).float()
    entropy = torch.rand(12, 6) * 3
    settings = {"alpha2": 0.0, "scope": scope, "stats_weight": stats_weight}
    padded = load_algorithm("gtpo", advantage={**settings, "norm": "per_polarity_padded"})
    joint = load_algorithm("gtpo", advantage={**settings, "norm": "joint"})
    expected = token_advantages(joint, rewards, rewards > 0, groups, mask, entropy)
    assert expected.abs().max() > 0.5
    # the joint std is twice each polarity's (values ±α1 against α1 / 0): eps acts a hair differently
    torch.testing.assert_close(token_advantages(padded, rewards, rewards > 0, groups, mask, entropy), expected, atol=1e-5, rtol=0)


def test_gtpo_with_alpha2_zero_is_the_dapo_advantage(load_algorithm):
    torch.manual_seed(0)
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    lengths = torch.tensor([5, 2, 7, 3, 1, 6, 4, 7])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).float()
    entropy = torch.rand(8, 7) * 3
    gtpo = load_algorithm("gtpo", advantage={"alpha2": 0.0})
    dapo = load_algorithm("dapo")
    expected = token_advantages(dapo, rewards, rewards > 0, groups, mask)
    torch.testing.assert_close(token_advantages(gtpo, rewards, rewards > 0, groups, mask, entropy), expected, atol=1e-5, rtol=0)
    # counting tokens instead of responses weights long answers more: no longer DAPO
    by_token = load_algorithm("gtpo", advantage={"alpha2": 0.0, "stats_weight": "token"})
    assert not torch.allclose(token_advantages(by_token, rewards, rewards > 0, groups, mask, entropy), expected, atol=1e-3)
    # literal Eq. 6 (per polarity) erases the ±α1 signal when α2 = 0
    literal = load_algorithm("gtpo", advantage={"alpha2": 0.0, "norm": "per_polarity"})
    assert token_advantages(literal, rewards, rewards > 0, groups, mask, entropy).abs().max() < 1e-6


def test_grpo_s_advantage_golden(load_algorithm):
    # Ĥ = [2, 6, 1]; O+ bonus 0.1·(2/8)·2 = 0.05 and 0.1·(6/8)·2 = 0.15; O− penalty 0.1
    # r̂ = [1.05, 1.15, -1.1] -> mean 0.3666667, std 1.2711546
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    entropy = torch.tensor([[1.0, 3.0], [6.0, 100.0], [0.5, 1.5]])
    advantages = token_advantages(load_algorithm("grpo_s"), GTPO_REWARDS, GTPO_REWARDS > 0, GTPO_GROUPS, mask, entropy)
    expected = torch.tensor([[0.537569, 0.537569], [0.616238, 0.0], [-1.153807, -1.153807]])
    torch.testing.assert_close(advantages, expected, atol=2e-6, rtol=0)


def test_grpo_s_with_beta2_zero_is_the_group_advantage(load_algorithm):
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0])
    groups = torch.tensor([4, 4, 4, 9, 9, 9])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]] * 2)
    entropy = torch.rand(6, 3)
    cfg = load_algorithm("grpo_s", advantage={"beta2": 0.0})
    expected = group_advantages(rewards, groups)[:, None] * mask
    torch.testing.assert_close(token_advantages(cfg, rewards, rewards > 0, groups, mask, entropy), expected)


@pytest.mark.parametrize("name", ["gtpo", "grpo_s"])
def test_entropy_weights_carry_no_gradient(load_algorithm, name):
    entropy = GTPO_ENTROPY.clone().requires_grad_(True)
    advantages = token_advantages(load_algorithm(name), GTPO_REWARDS, GTPO_REWARDS > 0, GTPO_GROUPS, GTPO_MASK, entropy)
    assert not advantages.requires_grad


@pytest.mark.parametrize("name", ["gtpo", "grpo_s"])
def test_entropy_estimators_refuse_missing_entropy(load_algorithm, name):
    with pytest.raises(ValueError, match="needs the old policy's per-token entropy"):
        token_advantages(load_algorithm(name), GTPO_REWARDS, GTPO_REWARDS > 0, GTPO_GROUPS, GTPO_MASK)
