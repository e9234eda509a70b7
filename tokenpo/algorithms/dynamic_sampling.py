"""DAPO dynamic sampling (arXiv 2503.14476 §3.2): which groups carry a learning signal."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

# torch for annotations only: the config schema imports this module before torch is imported
if TYPE_CHECKING:
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


# what a step does when max_gen_batches rounds found fewer mixed groups than prompts_per_step
ON_EXHAUSTED = ("error", "fill", "keep_partial")


def prompts_per_round(prompts_per_step: int, oversample: float, world_size: int) -> int:
    """Prompts drawn in every generation round: verl's DAPO `gen_batch_size` = ceil(oversample · prompts_per_step)
    (its recipe: 3 × the train batch), rounded up to a multiple of world_size so every rank generates as many."""
    drawn = math.ceil(oversample * prompts_per_step)
    return math.ceil(drawn / world_size) * world_size


def partial_batch_size(mixed_groups: int, parts: int) -> int:
    """Groups kept when rounds run out under `keep_partial`: the most of `mixed_groups` that split evenly
    over `parts` = ranks × mini-batches (possibly 0: then the step has no update)."""
    return mixed_groups // parts * parts
