"""Split statistics over successful (O+) and failed (O−) responses."""

from __future__ import annotations

import torch


def mean_by_polarity(values: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, prefix: str) -> dict[str, float]:
    """Means of `values` over the real entries of correct (`<prefix>/pos`) and wrong
    (`<prefix>/neg`) responses; `values` and `mask` are [B] or [B, T]. A polarity with no
    entry is left out rather than logged as NaN."""
    positive = correct.bool().view(-1, *([1] * (values.dim() - 1)))
    means = {}
    for name, selected in (("pos", positive), ("neg", ~positive)):
        weight = mask * selected
        total = float(weight.sum())
        if total > 0:
            means[f"{prefix}/{name}"] = float((values.detach() * weight).sum()) / total
    return means


def entropy_by_polarity(entropy: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor) -> dict[str, float]:
    """`entropy/pos` and `entropy/neg`: mean token entropy of O+ and O− responses."""
    return mean_by_polarity(entropy, mask, correct, "entropy")
