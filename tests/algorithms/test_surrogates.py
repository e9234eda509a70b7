"""The cispo, gmpo and sapo surrogates, through policy_loss with their shipped configs, against plain
loop-by-loop re-implementations of the papers' objectives (loss and gradient with respect to log π_θ), on a
hand-built batch: mixed-sign advantages, ratios inside and outside the clip ranges, padding, a one-token response.
"""

from __future__ import annotations

import math

import pytest
import torch

from tokenpo.algorithms import LossNorm, policy_loss

DOUBLE = dict(dtype=torch.float64)
LENGTHS = [4, 3, 1, 2]
# one advantage per response (GRPO's), mixed signs; row 2 is the one-token response
ADVANTAGES = [1.5, -0.8, 0.7, -1.2]
OLD = [[-1.0, -2.0, -0.5, -1.5], [-0.7, -1.1, -2.5, -3.0], [-0.9, -3.0, -3.0, -3.0], [-1.3, -0.4, -3.0, -3.0]]
# log r per token: 0 (on-policy), inside and outside ±0.4 and 1 ± 0.2, above log 5 = 1.61; padding gets 2.5, which
# the surrogates must ignore
LOG_RATIOS = [[0.0, 0.5, -0.6, 1.7], [0.3, -0.5, -2.0, 2.5], [0.2, 2.5, 2.5, 2.5], [0.45, 0.0, 2.5, 2.5]]


def leaf(values):
    return torch.tensor(values, **DOUBLE).requires_grad_(True)


def new_logp(log_ratios=LOG_RATIOS):
    return [[o + d for o, d in zip(row_old, row_d)] for row_old, row_d in zip(OLD, log_ratios)]


def run_policy_loss(cfg, logp_values, advantages=ADVANTAGES, lengths=LENGTHS, old=OLD):
    """(loss, metrics, gradient wrt logp) of the pipeline's policy_loss on the batch."""
    width = len(old[0])
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(**DOUBLE)
    logp = leaf(logp_values)
    adv = torch.tensor(advantages, **DOUBLE)[:, None] * mask
    loss, metrics = policy_loss(cfg, logp, torch.tensor(old, **DOUBLE), adv, mask, LossNorm.from_mask(mask, width))
    loss.backward()
    return loss.item(), metrics, logp.grad


def reference_gradient(reference, logp_values, **kwargs):
    logp = leaf(logp_values)
    loss = reference(logp, **kwargs)
    loss.backward()
    return loss.item(), logp.grad


def reference_cispo(logp, clip_low, clip_high, advantages=ADVANTAGES, lengths=LENGTHS, old=OLD):
    """MiniMax-M1 §3.1: −1/Σ|o_i| Σ_i Σ_t sg(clip(r, 1 − ε_low, 1 + ε_high))·A_i·log π_θ."""
    total = 0.0
    for i, length in enumerate(lengths):
        for t in range(length):
            weight = min(math.exp(logp[i][t].item() - old[i][t]), 1 + clip_high)
            if clip_low is not None:
                weight = max(weight, 1 - clip_low)
            total = total - weight * advantages[i] * logp[i][t]
    return total / sum(lengths)


def reference_gmpo(logp, clip_low, clip_high, advantages=ADVANTAGES, lengths=LENGTHS, old=OLD):
    """GMPO: −1/G Σ_i A_i·exp(1/|o_i| Σ_t sgn(A_i)·min(sgn(A_i)·log r_t, sgn(A_i)·clip(log r_t, −ε_l, ε_h)))."""
    total = 0.0
    for i, length in enumerate(lengths):
        sign = (advantages[i] > 0) - (advantages[i] < 0)
        log_sum = 0.0
        for t in range(length):
            log_ratio = logp[i][t] - old[i][t]
            clipped = log_ratio.clamp(-clip_low, clip_high)
            log_sum = log_sum + sign * min(sign * log_ratio, sign * clipped)
        total = total - advantages[i] * torch.exp(log_sum / length)
    return total / len(lengths)


def reference_sapo(logp, tau_pos, tau_neg, advantages=ADVANTAGES, lengths=LENGTHS, old=OLD):
    """SAPO: −1/G Σ_i 1/|o_i| Σ_t f(r_t)·A_i, f(r) = σ(τ(r − 1))·4/τ, τ = τ_pos if A_i > 0 else τ_neg."""
    total = 0.0
    for i, length in enumerate(lengths):
        tau = tau_pos if advantages[i] > 0 else tau_neg
        row = 0.0
        for t in range(length):
            ratio = torch.exp(logp[i][t] - old[i][t])
            row = row - torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages[i]
        total = total + row / length
    return total / len(lengths)


def real_tokens(lengths=LENGTHS):
    return [(i, t) for i, length in enumerate(lengths) for t in range(length)]


@pytest.mark.parametrize("clip_low", [None, 0.2])
def test_cispo_matches_the_plain_reimplementation(load_algorithm, clip_low):
    cfg = load_algorithm("cispo", loss={"cispo_clip_low": clip_low})
    loss, metrics, grad = run_policy_loss(cfg, new_logp())
    expected, expected_grad = reference_gradient(reference_cispo, new_logp(), clip_low=clip_low, clip_high=4.0)
    assert loss == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)
    # no token is dropped: every real token has a gradient, the one with r = e^1.7 > 5 and (no lower bound) e^−2
    assert all(grad[i, t] != 0 for i, t in real_tokens())
    assert grad[torch.tensor(LENGTHS)[:, None] <= torch.arange(4)].abs().max() == 0

    ratios = [math.exp(LOG_RATIOS[i][t]) for i, t in real_tokens()]
    weights = [max(min(r, 5.0), 1 - clip_low) if clip_low is not None else min(r, 5.0) for r in ratios]
    # clipped above: e^1.7; below 0.8 with ε_low = 0.2: e^−0.6, e^−0.5 and e^−2
    assert metrics["cispo/clipped_frac"] == pytest.approx((1 if clip_low is None else 4) / 10)
    assert metrics["cispo/weight_mean"] == pytest.approx(sum(weights) / 10)


def test_gmpo_matches_the_plain_reimplementation(load_algorithm):
    cfg = load_algorithm("gmpo")
    loss, metrics, grad = run_policy_loss(cfg, new_logp())
    expected, expected_grad = reference_gradient(reference_gmpo, new_logp(), clip_low=0.4, clip_high=0.4)
    assert loss == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)
    # the clip cuts the gradient of A > 0 tokens above log r = 0.4 and of A < 0 tokens below −0.4, nothing else
    cut = {(0, 1), (0, 3), (1, 1), (1, 2)}
    assert all((grad[i, t] == 0) == ((i, t) in cut) for i, t in real_tokens())
    assert metrics["gmpo/clip_high_frac"] == pytest.approx(2 / 10)
    assert metrics["gmpo/clip_low_frac"] == pytest.approx(2 / 10)
    rho = [math.exp((0.0 + 0.4 - 0.6 + 0.4) / 4), math.exp((0.3 - 0.4 - 0.4) / 3), math.exp(0.2),
           math.exp((0.45 + 0.0) / 2)]
    assert metrics["gmpo/ratio_mean"] == pytest.approx(sum(rho) / 4)
    assert loss == pytest.approx(-sum(a * r for a, r in zip(ADVANTAGES, rho)) / 4)


def test_gmpo_one_token_response_is_the_clipped_token_ratio(load_algorithm):
    cfg = load_algorithm("gmpo")
    for advantage, log_ratio, rho in [(2.0, 0.9, math.exp(0.4)), (2.0, -0.9, math.exp(-0.9)),
                                      (-2.0, -0.9, math.exp(-0.4)), (-2.0, 0.9, math.exp(0.9))]:
        loss, _, _ = run_policy_loss(cfg, [[-1.0 + log_ratio]], advantages=[advantage], lengths=[1], old=[[-1.0]])
        assert loss == pytest.approx(-advantage * rho)


def test_sapo_matches_the_plain_reimplementation(load_algorithm):
    cfg = load_algorithm("sapo")
    loss, metrics, grad = run_policy_loss(cfg, new_logp())
    expected, expected_grad = reference_gradient(reference_sapo, new_logp(), tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)

    def tau(i):
        return 1.0 if ADVANTAGES[i] > 0 else 1.05

    def sigma(i, t):
        return 1 / (1 + math.exp(-tau(i) * (math.exp(LOG_RATIOS[i][t]) - 1)))

    gates = {(i, t): sigma(i, t) * 4 / tau(i) for i, t in real_tokens()}
    weights = {(i, t): math.exp(LOG_RATIOS[i][t]) * 4 * sigma(i, t) * (1 - sigma(i, t)) for i, t in real_tokens()}
    positive = [key for key in weights if ADVANTAGES[key[0]] > 0]
    negative = [key for key in weights if ADVANTAGES[key[0]] < 0]
    assert metrics["sapo/gate_mean"] == pytest.approx(sum(gates.values()) / 10)
    assert metrics["sapo/grad_weight_mean"] == pytest.approx(sum(weights.values()) / 10)
    assert metrics["sapo/grad_weight_pos"] == pytest.approx(sum(weights[k] for k in positive) / len(positive))
    assert metrics["sapo/grad_weight_neg"] == pytest.approx(sum(weights[k] for k in negative) / len(negative))


@pytest.mark.parametrize("name", ["cispo", "gmpo", "sapo"])
def test_zero_advantages_give_zero_loss_and_gradient(load_algorithm, name):
    loss, _, grad = run_policy_loss(load_algorithm(name), new_logp(), advantages=[0.0] * 4)
    assert loss == 0
    assert grad.abs().max() == 0


@pytest.mark.parametrize("name", ["cispo", "gmpo", "sapo"])
def test_at_ratio_one_the_gradient_is_the_plain_policy_gradient(load_algorithm, name):
    """r = 1 (the first update of a step): CISPO is REINFORCE, GMPO's ρ_i = 1, SAPO's f'(1) = 1; each gradient is
    −A·∇log π under its aggregation, the clipped surrogate's gradient at r = 1."""
    cfg = load_algorithm(name)
    _, metrics, grad = run_policy_loss(cfg, OLD)
    _, _, clipped_grad = run_policy_loss(load_algorithm("grpo", loss={"kl_coef": 0.0}, aggregation=cfg.aggregation), OLD)
    torch.testing.assert_close(grad, clipped_grad, rtol=1e-12, atol=1e-15)
    denominators = {"token-mean": lambda i: sum(LENGTHS), "seq-mean-token-mean": lambda i: LENGTHS[i] * 4}
    for i, t in real_tokens():
        assert grad[i, t].item() == pytest.approx(-ADVANTAGES[i] / denominators[cfg.aggregation](i))
    on_policy = {"cispo": {"cispo/clipped_frac": 0.0, "cispo/weight_mean": 1.0},
                 "gmpo": {"gmpo/clip_high_frac": 0.0, "gmpo/clip_low_frac": 0.0, "gmpo/ratio_mean": 1.0},
                 # gate σ(0)·4/τ = 2/τ: 2 on the 5 A > 0 tokens, 2/1.05 on the 5 A < 0 ones
                 "sapo": {"sapo/gate_mean": (5 * 2 + 5 * 2 / 1.05) / 10, "sapo/grad_weight_mean": 1.0,
                          "sapo/grad_weight_pos": 1.0, "sapo/grad_weight_neg": 1.0}}[name]
    assert {key: metrics[key] for key in on_policy} == pytest.approx(on_policy)
