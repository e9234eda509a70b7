"""DAPO dynamic sampling: which groups carry a learning signal."""

from __future__ import annotations

import torch


def select_mixed_groups(rewards: torch.Tensor, group_ids: torch.Tensor, needed: int) -> list[int]:
    """Ids of at most `needed` groups whose rewards are not all equal, in order of first
    appearance. DAPO filters on accuracy: pass `correct.float()` as `rewards` for that. The
    generation rounds live in the trainer, which calls this on everything sampled so far."""
    if needed < 0:
        raise ValueError(f"needed must be >= 0, got {needed}")
    rewards_by_group: dict[int, set[float]] = {}
    for group, reward in zip(group_ids.tolist(), rewards.tolist()):
        rewards_by_group.setdefault(group, set()).add(reward)
    mixed = [group for group, seen in rewards_by_group.items() if len(seen) > 1]
    return mixed[:needed]
