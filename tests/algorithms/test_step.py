"""prepare_step (once per step on the global batch) and micro_batch_loss (per micro-batch): the two calls the
trainer makes. Every registered advantage estimator and every shipped config is picked up by name lists read from
the registries and conf/algorithm/, so a new one is tested without editing this file."""

from __future__ import annotations

import math

import pytest
import torch

from support.config import ALGORITHM_NAMES
from tokenpo.algorithms import (
    ADVANTAGES,
    LossNorm,
    StepBatch,
    algorithm_config_from_dict,
    micro_batch_loss,
    prepare_step,
    response_mask,
)


LENGTHS = torch.tensor([3, 1, 2, 2, 0, 3, 1, 2])


def step_batch(**fields) -> StepBatch:
    """2 groups of 4: group 0 mixed (response 3 in the asked-for form), group 1 mixed with an empty response;
    an old entropy that differs per token; one update per step unless `mini_batches` says otherwise."""
    generator = torch.Generator().manual_seed(0)
    mask = response_mask(LENGTHS)
    values = dict(
        correct=torch.tensor([True, False, False, True, False, True, True, False]),
        valid=torch.ones(8, dtype=torch.bool),
        truncated=LENGTHS == 3,
        in_format=torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
        lengths=LENGTHS,
        group_ids=torch.arange(8) // 4,
        mask=mask,
        max_new_tokens=3,
        mini_batches=1,
        old_entropy=(torch.rand(8, 3, generator=generator) + 0.1) * mask,
    )
    return StepBatch(**{**values, **fields})


def estimator_config(name: str, **loss):
    """GRPO's settings with the estimator `name`, without the KL term (no reference model here)."""
    return algorithm_config_from_dict({"advantage": {"estimator": name}, "loss": {"kl_coef": 0.0, **loss}})


def test_response_mask():
    assert response_mask(torch.tensor([2, 0, 3])).tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 1]]
    assert response_mask(torch.tensor([0, 0])).shape == (2, 1)


def test_prepare_step_grpo_golden():
    """GRPO 1/0 rewards plus a 0.5 format bonus; the invalid-gold response leaves the loss mask, not the group
    statistics; two mini-batches of one group each get their own normalisers."""
    batch = step_batch(format_weight=0.5, mini_batches=2, valid=torch.tensor([True] * 7 + [False]))
    step = prepare_step(algorithm_config_from_dict({}), batch)
    assert step.rewards.tolist() == [1.0, 0.0, 0.0, 1.5, 0.0, 1.0, 1.0, 0.0]
    assert step.metrics["reward/asked_format_frac"] == 1 / 8
    assert step.loss_mask.sum(1).tolist() == [3, 1, 2, 2, 0, 3, 1, 0]
    assert step.loss_norms == (LossNorm(8.0, 4.0, 3), LossNorm(4.0, 2.0, 3))
    # group 0: mean 0.625, unbiased std of [1, 0, 0, 1.5] = sqrt(0.5625) = 0.75
    torch.testing.assert_close(step.advantages[:4, 0], torch.tensor([0.5, -0.8333333, -0.8333333, 1.1666666]))
    assert (step.advantages * (1 - batch.mask)).abs().max() == 0
    torch.testing.assert_close(step.entropy_reference, batch.old_entropy)


def test_prepare_step_without_old_entropy_has_no_entropy_reference():
    step = prepare_step(algorithm_config_from_dict({}), step_batch(old_entropy=None))
    assert step.entropy_reference is None


def test_mini_batches_must_split_the_rows():
    with pytest.raises(ValueError, match="8 rows do not split into 3 equal mini-batches"):
        prepare_step(algorithm_config_from_dict({}), step_batch(mini_batches=3))


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_every_shipped_config_scores_right_answers_up_and_wrong_ones_down(load_algorithm, name):
    """The step of every conf/algorithm/*.yaml on two mixed groups of equal-length, untruncated responses (nothing
    for length shaping or overlong filtering to act on): every response stays in the loss, a right answer gets a
    higher reward than a wrong one, and every token of a right answer a positive advantage, of a wrong one a negative
    advantage, whatever the estimator's scale or token weighting."""
    lengths = torch.full((8,), 2)
    correct = torch.tensor([True, False, False, True, False, True, True, True])
    old_entropy = torch.rand(8, 2, generator=torch.Generator().manual_seed(0)) + 0.1
    batch = step_batch(correct=correct, lengths=lengths, truncated=torch.zeros(8, dtype=torch.bool),
                       mask=response_mask(lengths), old_entropy=old_entropy)
    step = prepare_step(load_algorithm(name), batch)
    torch.testing.assert_close(step.loss_mask, batch.mask)
    assert step.rewards[correct].min() > step.rewards[~correct].max()
    assert (step.advantages[correct] > 0).all() and (step.advantages[~correct] < 0).all(), step.advantages


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_every_estimator_keeps_the_advantage_contract(name):
    """[N, T], finite, 0 on padding, no gradient into the rewards or the entropy, blind to group-id values, and a
    clear error when it needs the old entropy and gets none."""
    batch = step_batch()
    entropy = batch.old_entropy.clone().requires_grad_(True)
    cfg = estimator_config(name)
    advantages = prepare_step(cfg, step_batch(old_entropy=entropy)).advantages
    assert advantages.shape == batch.mask.shape and torch.isfinite(advantages).all() and not advantages.requires_grad
    assert (advantages[batch.mask == 0] == 0).all()
    assert advantages.abs().sum() > 0
    renamed = prepare_step(cfg, step_batch(group_ids=torch.tensor([7] * 4 + [-3] * 4))).advantages
    torch.testing.assert_close(renamed, advantages)
    if ADVANTAGES.trait(name, "needs_entropy"):
        with pytest.raises(ValueError, match="needs the old policy's per-token entropy"):
            prepare_step(cfg, step_batch(old_entropy=None))


@pytest.mark.parametrize("name", ADVANTAGES.names())
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_micro_batches_give_the_step_loss_and_gradients_for_every_estimator(name, entropy_coef):
    """The trainer's split (2 mini-batches, micro-batches of uneven size) sums, per update, to the loss and the
    gradients of the update's whole mini-batch, the entropy bonus included."""
    cfg = estimator_config(name, entropy_coef=entropy_coef)
    step = prepare_step(cfg, step_batch(mini_batches=2))
    generator = torch.Generator().manual_seed(1)
    old_logp = -torch.rand(8, 3, generator=generator) * 2
    logp_values = old_logp + torch.randn(8, 3, generator=generator) * 0.1
    entropy_values = torch.rand(8, 3, generator=generator)

    def update(mini_batch: int, splits: list[list[int]]):
        logp = logp_values.clone().requires_grad_(True)
        entropy = entropy_values.clone().requires_grad_(True)
        total = sum(micro_batch_loss(cfg, step, rows, mini_batch, logp[rows], entropy[rows], old_logp=old_logp[rows])[0]
                    for rows in splits)
        total.backward()
        return total, logp.grad, entropy.grad

    for mini_batch, rows in enumerate([[0, 1, 2, 3], [4, 5, 6, 7]]):
        whole = update(mini_batch, [rows])
        split = update(mini_batch, [rows[:1], rows[1:]])
        for got, want in zip(split, whole):
            torch.testing.assert_close(got, want)
        # without the bonus no gradient reaches the entropy at all
        assert (whole[2] is not None and whole[2].abs().sum() > 0) == (entropy_coef != 0)
        assert math.isfinite(whole[0].item())


def test_micro_batch_loss_is_on_policy_without_old_logp():
    cfg = estimator_config("grpo")
    step = prepare_step(cfg, step_batch())
    logp = -torch.rand(8, 3, generator=torch.Generator().manual_seed(2))
    on_policy, metrics = micro_batch_loss(cfg, step, list(range(8)), 0, logp, torch.zeros(8, 3))
    assert metrics["kl/old"] == 0.0 and metrics["clip/low_frac"] == 0.0
    # ratio 1 everywhere: −mean over sequences of the mean advantage (seq-mean-token-mean)
    per_sequence = (step.advantages * step.loss_mask).sum(1) / step.loss_mask.sum(1).clamp(min=1)
    assert float(on_policy) == pytest.approx(float(-per_sequence.sum() / 7), abs=1e-6)
