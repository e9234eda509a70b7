"""Importance ratios and KL estimators against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from tokenpo.algorithms import importance_ratio, kl_penalty

LN2 = math.log(2)
# sequence 0: log ratios ln2, -ln2, (pad); sequence 1: ln2 only
LOG_RATIO = torch.tensor([[LN2, -LN2, 7.0], [LN2, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def ratio(kind, log_ratio=LOG_RATIO, mask=MASK):
    logp = log_ratio.clone().requires_grad_(True)
    return logp, importance_ratio(kind, logp, torch.zeros_like(logp), mask)


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("token", [[2.0, 0.5, math.exp(7.0)], [2.0, 1.0, 1.0]]),
        ("sequence_arithmetic", [[1.25] * 3, [2.0] * 3]),  # (2 + 0.5) / 2
        ("sequence_geometric", [[1.0] * 3, [2.0] * 3]),  # exp((ln2 - ln2) / 2)
        ("sequence_token", [[1.0] * 3, [2.0] * 3]),  # value of the geometric ratio
    ],
)
def test_ratio_values(kind, expected):
    torch.testing.assert_close(ratio(kind)[1], torch.tensor(expected))


def test_sequence_token_ratio_has_each_tokens_own_gradient():
    # d s_{i,t} / d logp_{i,t'} = s_i if t' == t else 0 (GSPO-token)
    logp, values = ratio("sequence_token")
    (values * MASK * torch.tensor([[1.0, 10.0, 0.0], [100.0, 0.0, 0.0]])).sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[1.0, 10.0, 0.0], [200.0, 0.0, 0.0]]))


def test_sequence_geometric_ratio_gradient_spreads_over_the_sequence():
    # d s_i / d logp_{i,t} = s_i / |o_i| for every real token
    logp, values = ratio("sequence_geometric")
    values[:, 0].sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5, 0.5, 0.0], [2.0, 0.0, 0.0]]))


def test_log_ratio_is_clamped_before_exp_and_empty_sequences_stay_finite():
    log_ratio = torch.tensor([[50.0, -50.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    torch.testing.assert_close(ratio("token", log_ratio, mask)[1][0], torch.tensor([math.exp(20), math.exp(-20)]))
    for kind in ("sequence_arithmetic", "sequence_geometric", "sequence_token"):
        assert torch.isfinite(ratio(kind, log_ratio, mask)[1]).all()


def test_unknown_ratio_lists_known_kinds():
    with pytest.raises(ValueError, match="known: sequence_arithmetic, sequence_geometric, sequence_token, token"):
        importance_ratio("tok", LOG_RATIO, LOG_RATIO, MASK)


@pytest.mark.parametrize(
    "estimator, expected",
    [
        ("k1", LN2),  # -d with d = ln(0.25 / 0.5) = -ln2
        ("k2", LN2**2 / 2),
        ("k3", 0.5 + LN2 - 1),  # exp(d) - d - 1
    ],
)
def test_kl_estimators_golden(estimator, expected):
    value = kl_penalty(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]), estimator)
    assert value.item() == pytest.approx(expected, rel=1e-6)


def test_kl_estimates_are_clamped_and_zero_at_equal_policies():
    far = kl_penalty(torch.tensor([0.0, 0.0]), torch.tensor([30.0, -30.0]), "k3")
    torch.testing.assert_close(far, torch.tensor([10.0, 10.0]))
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "k1").item() == 10.0
    same = torch.tensor([-1.3, -0.2])
    for estimator in ("k1", "k2", "k3"):
        assert kl_penalty(same, same, estimator).abs().max() == 0
