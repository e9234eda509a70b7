"""Entropy-based advantage (Cheng et al., arXiv 2506.14758): A' = A + min(α·sg(H), |A|/κ) against a plain loop."""

from __future__ import annotations

import torch

from tokenpo.algorithms.advantages import entropy_shaped_advantages


def reference(advantages: list[list[float]], entropy: list[list[float]], alpha: float, kappa: float) -> list[list[float]]:
    return [[a + min(alpha * h, abs(a) / kappa) for a, h in zip(row_a, row_h)] for row_a, row_h in zip(advantages, entropy)]


def test_matches_the_paper_formula_token_by_token():
    adv = [[1.0, 1.0, -1.0, 0.0], [0.3, -0.8, 2.0, -0.1]]
    ent = [[0.5, 3.0, 2.0, 1.5], [0.0, 0.1, 4.0, 0.9]]
    out = entropy_shaped_advantages(torch.tensor(adv), torch.tensor(ent), 0.4, 2.0)
    assert torch.allclose(out, torch.tensor(reference(adv, ent, 0.4, 2.0)))


def test_boundaries_zero_advantage_negative_sign_kept_and_padding():
    adv, ent = torch.tensor([0.0, -1.0, -1.0, 0.0]), torch.tensor([5.0, 0.5, 5.0, 0.0])
    out = entropy_shaped_advantages(adv, ent, 0.4, 2.0)
    # A = 0 gets nothing; A < 0 gains a positive term capped at |A|/κ and stays negative; padding (A = H = 0) stays 0
    assert torch.allclose(out, torch.tensor([0.0, -0.8, -0.5, 0.0]))


def test_no_gradient_flows_into_the_entropy():
    ent = torch.tensor([1.0, 2.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0], requires_grad=True)
    out = entropy_shaped_advantages(adv, ent, 0.4, 2.0)
    out.sum().backward()
    assert ent.grad is None
