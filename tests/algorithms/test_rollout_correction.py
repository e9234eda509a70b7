"""Sampler/trainer mismatch metrics and truncated importance sampling (algorithm.loss.tis_cap)."""

from __future__ import annotations

import math

import pytest
import torch

from tokenpo.algorithms import LossNorm, policy_loss
from tokenpo.algorithms.rollout_correction import behaviour_weight, sampler_mismatch, truncated_importance_weight

# one response, three tokens: the trainer gives them 0.5 and 2.5 nats more than the sampler on tokens 0 and 2
TRAINER = torch.tensor([[-1.0, -2.0, -0.5]])
SAMPLER = torch.tensor([[-1.5, -2.0, -3.0]])
ADVANTAGES = torch.tensor([[1.0, -1.0, 2.0]])
MASK = torch.ones(1, 3)


def on_policy_loss(cfg, sampler_logp=None):
    """Loss, metrics and d loss / d logp at logp = old_logp = TRAINER (every ratio 1)."""
    logp = TRAINER.clone().requires_grad_(True)
    loss, metrics = policy_loss(cfg, logp, TRAINER, ADVANTAGES, MASK, LossNorm.from_mask(MASK, 4),
                                sampler_logp=sampler_logp)
    loss.backward()
    return loss.item(), metrics, logp.grad


def test_truncated_importance_weight_golden():
    weight = truncated_importance_weight(TRAINER, SAMPLER, cap=2.0)
    torch.testing.assert_close(weight, torch.tensor([[math.exp(0.5), 1.0, 2.0]]))
    assert not weight.requires_grad


def test_sampler_mismatch_golden():
    metrics = sampler_mismatch(TRAINER, SAMPLER, MASK)
    assert float(metrics["mismatch/abs_logp_diff"]) == pytest.approx(1.0)
    # k3 of d = trainer - sampler: exp(d) - d - 1
    kl = (math.exp(0.5) - 1.5 + 0.0 + math.exp(2.5) - 3.5) / 3
    assert float(metrics["mismatch/kl"]) == pytest.approx(kl, rel=1e-6)


def test_tis_weights_the_policy_gradient_loss_golden(load_algorithm):
    # DAPO: token-mean, no KL; on-policy every ratio is 1, so a token's loss is -A x its TIS weight
    loss, metrics, grad = on_policy_loss(load_algorithm("dapo", loss={"tis_cap": 2.0}), SAMPLER)
    weights = [math.exp(0.5), 1.0, 2.0]
    assert loss == pytest.approx(-(1.0 * weights[0] - 1.0 * weights[1] + 2.0 * weights[2]) / 3)
    torch.testing.assert_close(grad, torch.tensor([[-weights[0], weights[1], -2.0 * weights[2]]]) / 3)
    assert metrics["tis/weight_mean"] == pytest.approx(sum(weights) / 3)
    assert metrics["tis/capped_frac"] == pytest.approx(1 / 3)
    assert metrics["mismatch/abs_logp_diff"] == pytest.approx(1.0)


def test_tis_off_only_logs_the_mismatch(load_algorithm):
    plain_loss, plain_metrics, plain_grad = on_policy_loss(load_algorithm("dapo"))
    loss, metrics, grad = on_policy_loss(load_algorithm("dapo"), SAMPLER)
    assert loss == plain_loss and torch.equal(grad, plain_grad)
    assert set(metrics) - set(plain_metrics) == {"mismatch/abs_logp_diff", "mismatch/kl"}


def test_tis_with_identical_logprobs_changes_nothing(load_algorithm):
    plain_loss, _, plain_grad = on_policy_loss(load_algorithm("dapo"))
    loss, metrics, grad = on_policy_loss(load_algorithm("dapo", loss={"tis_cap": 2.0}), TRAINER.clone())
    assert loss == plain_loss and torch.equal(grad, plain_grad)
    assert metrics["tis/weight_mean"] == 1.0 and metrics["tis/capped_frac"] == 0.0
    assert metrics["mismatch/abs_logp_diff"] == 0.0 and metrics["mismatch/kl"] == 0.0


def test_masked_behaviour_weight_drops_the_tokens_past_the_cap_golden():
    """AReaL's decoupled PPO: a token whose behaviour weight passes the cap leaves the loss (weight 0), the others
    keep their weight untruncated."""
    weight = behaviour_weight(TRAINER, SAMPLER, cap=2.0, mode="mask")
    torch.testing.assert_close(weight, torch.tensor([[math.exp(0.5), 1.0, 0.0]]))
    torch.testing.assert_close(behaviour_weight(TRAINER, SAMPLER, 2.0, "truncate"),
                               truncated_importance_weight(TRAINER, SAMPLER, cap=2.0))


def test_masked_mode_in_the_loss_golden(load_algorithm):
    loss, metrics, grad = on_policy_loss(load_algorithm("dapo", loss={"tis_cap": 2.0, "tis_mode": "mask"}), SAMPLER)
    # token-mean of -A x w over 3 tokens: token 2 (w = e^2.5 > 2) is out
    assert loss == pytest.approx((-1.0 * math.exp(0.5) + 1.0 * 1.0 - 0.0) / 3)
    torch.testing.assert_close(grad, torch.tensor([[-math.exp(0.5), 1.0, 0.0]]) / 3)
    assert metrics["tis/capped_frac"] == pytest.approx(1 / 3)
    assert metrics["tis/raw_weight_max"] == pytest.approx(math.exp(2.5))
