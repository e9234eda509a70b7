"""Sequence rewards: correctness reward, DAPO soft overlong punishment, GTPO's GROP, and DAPO
overlong filtering (which responses stay in the loss)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tokenpo.algorithms.masked import dense_group_index, group_reduce
from tokenpo.algorithms.metrics import mean_by_polarity

if TYPE_CHECKING:
    from tokenpo.algorithms.config import AlgorithmConfig, ShapingConfig


def overlong_cache_len(shaping: ShapingConfig, max_new_tokens: int) -> int:
    """L_cache in tokens: a fraction of L_max (paper 4096 of 20480 = 0.2), at least one token."""
    return max(1, round(shaping.overlong_cache_frac * max_new_tokens))


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment [B] (arXiv 2503.14476 §3.4): 0 while |o| ≤ L_max − L_cache, then
    ((L_max − L_cache) − |o|) / L_cache, and −1 from L_max on."""
    return ((max_len - cache_len - lengths) / cache_len).clamp(-1.0, 0.0)


def grop_length_threshold(lengths: torch.Tensor, members: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """GROP's L+ [B] (GTPO App. D): max((min + max)/2, mean) of the lengths of each group's
    `members`, at least 1 token; undefined (NaN) in a group without members."""
    inf = torch.full_like(lengths, float("inf"))
    shortest = group_reduce(torch.where(members, lengths, inf), index, "amin")
    longest = group_reduce(torch.where(members, lengths, -inf), index, "amax")
    count = group_reduce(members.to(lengths.dtype), index)
    mean = group_reduce(torch.where(members, lengths, torch.zeros_like(lengths)), index) / count.clamp_min(1.0)
    return torch.maximum((shortest + longest) / 2, mean).clamp_min(1.0)


def grop_penalty(
    lengths: torch.Tensor, correct: torch.Tensor, group_ids: torch.Tensor, gamma1: float, medium: bool
) -> torch.Tensor:
    """GTPO group-relative overlong punishment [B] (App. D). A correct response longer than L+
    gets −½·(|o| − L+)/L+, capped at −½ (reached at 2·L+), in an easy group (n/G ≥ γ1; L+ over
    the correct lengths) and, when `medium`, in a medium group (n > m but n/G < γ1; L+ over all
    G lengths). Wrong responses and every other group get 0."""
    index = dense_group_index(group_ids)
    num_correct = group_reduce(correct.to(lengths.dtype), index)
    size = group_reduce(torch.ones_like(lengths), index)
    easy = num_correct / size >= gamma1
    is_medium = ~easy & (num_correct > size - num_correct) & medium
    everyone = torch.ones_like(correct)
    target = torch.where(easy, grop_length_threshold(lengths, correct, index), grop_length_threshold(lengths, everyone, index))
    excess = ((lengths - target) / target).clamp(0.0, 1.0)
    return torch.where(correct & (easy | is_medium), -0.5 * excess, torch.zeros_like(lengths))


def shape_rewards(
    cfg: AlgorithmConfig,
    correct: torch.Tensor,
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    group_ids: torch.Tensor,
    max_new_tokens: int,
    score: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Rewards [B], keep [B] bool (False: drop from the loss; multiply the loss mask by it) and
    metrics. `lengths` are response lengths in tokens, `max_new_tokens` is L_max. `score` [B]: the weighted reward
    functions' sum S (tokenpo.rewards.weighted), mapped onto the algorithm's scale as wrong + (correct − wrong)·S;
    None: the verdict alone, `correct` or `wrong`."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    shaping = cfg.shaping
    correct, truncated, lengths = correct.bool(), truncated.bool(), lengths.float()
    if score is None:
        rewards = torch.where(correct, cfg.reward.correct, cfg.reward.wrong).to(lengths.dtype)
    else:
        rewards = (cfg.reward.wrong + (cfg.reward.correct - cfg.reward.wrong) * score).to(lengths.dtype)
    metrics: dict[str, float] = {}
    if shaping.soft_overlong:
        penalty = soft_overlong_penalty(lengths, max_new_tokens, overlong_cache_len(shaping, max_new_tokens))
        rewards = rewards + penalty
        metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
    if shaping.grop:
        penalty = grop_penalty(lengths, correct, group_ids, shaping.grop_gamma1, shaping.grop_medium)
        rewards = rewards + penalty
        metrics["reward/grop_penalty_mean"] = float(penalty.mean())
        metrics["reward/grop_penalized_frac"] = float((penalty < 0).float().mean())
    keep = ~truncated if shaping.overlong_filter else torch.ones_like(truncated)
    metrics["reward/kept_frac"] = float(keep.float().mean())
    metrics["reward/shaped_mean"] = float(rewards.mean())
    metrics.update(mean_by_polarity(rewards, torch.ones_like(rewards), correct, "reward/shaped"))
    return rewards, keep, metrics
