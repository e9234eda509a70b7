"""Masked and per-group reductions shared by the algorithm modules.

`mask` is float [B, T] with 1 on real response tokens; a group is the set of responses to one
prompt, identified by equal `group_ids`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# torch for annotations only: the config schema imports this module before torch is imported
if TYPE_CHECKING:
    import torch


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B]: mean over each sequence's real tokens (0 for an empty sequence)."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scalar mean over every real token of the batch (0 when there is none)."""
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def dense_group_index(group_ids: torch.Tensor) -> torch.Tensor:
    """Arbitrary group ids [B] -> 0..P-1 so they can index per-group buffers."""
    return group_ids.unique(return_inverse=True)[1]


def group_reduce(values: torch.Tensor, index: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    """Reduce `values` [B, ...] over the members of each group ("sum", "amin", "amax") and hand
    every member its group's result, so the output has the shape of `values`."""
    num_groups = int(index.max()) + 1 if index.numel() else 0
    expanded = index.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    per_group = values.new_zeros((num_groups, *values.shape[1:]))
    per_group = per_group.scatter_reduce(0, expanded, values, reduce, include_self=False)
    return per_group[index]
