"""Aggregation modes: golden values, and micro-batches summing to the full batch (values and gradients)."""

from __future__ import annotations

import pytest
import torch

from tokenpo.algorithms import AGGREGATIONS, LossNorm, aggregate

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # third response is empty
# each mode's loss of LOSS under MASK, by hand (the max_len of seq-mean-token-sum-norm is 5)
GOLDEN = {
    "token-mean": (1 + 2 + 3 + 4) / 4,
    "seq-mean-token-mean": (6 / 3 + 4 / 1) / 2,
    "seq-mean-token-sum": (6 + 4) / 2,
    "seq-mean-token-sum-norm": (6 + 4) / (2 * 5),
}


def test_loss_norm_counts_tokens_and_non_empty_sequences():
    assert LossNorm.from_mask(MASK, 5) == LossNorm(num_tokens=4.0, num_seqs=2.0, max_len=5)


@pytest.mark.parametrize("mode, expected", GOLDEN.items())
def test_aggregation_golden(mode, expected):
    assert aggregate(LOSS, MASK, mode, LossNorm.from_mask(MASK, 5)).item() == pytest.approx(expected)


def test_every_registered_mode_has_a_golden_value():
    """A new aggregation mode fails here until its hand-computed value joins GOLDEN (and so the golden test)."""
    assert sorted(GOLDEN) == AGGREGATIONS.names()


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
@pytest.mark.parametrize("splits", [[2, 2, 2], [1, 2, 3], [6]])
def test_micro_batches_sum_to_the_full_batch(mode, splits):
    # also what 2 ranks × B/2 compute: each rank's share over the same global norm
    torch.manual_seed(1)
    lengths = torch.tensor([5, 1, 3, 7, 2, 6])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).float()
    weights = torch.randn(6, 7)
    norm = LossNorm.from_mask(mask, 8)

    full_leaf = torch.randn(6, 7, requires_grad=True)
    full = aggregate(full_leaf**2 * weights, mask, mode, norm)
    full.backward()

    micro_leaf = full_leaf.detach().clone().requires_grad_(True)
    total = sum(
        aggregate(part**2 * w, m, mode, norm)
        for part, w, m in zip(micro_leaf.split(splits), weights.split(splits), mask.split(splits))
    )
    total.backward()
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(micro_leaf.grad, full_leaf.grad)


def test_local_denominators_would_be_wrong():
    # the trap the global norm avoids: averaging per-micro-batch token means
    lengths = torch.tensor([1, 6])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    loss = torch.arange(12.0).view(2, 6)
    full = aggregate(loss, mask, "token-mean", LossNorm.from_mask(mask, 6))
    local = sum(aggregate(l, m, "token-mean", LossNorm.from_mask(m, 6)) for l, m in zip(loss.split(1), mask.split(1))) / 2
    assert not torch.isclose(full, local)
