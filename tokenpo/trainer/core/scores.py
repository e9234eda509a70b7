"""The step's responses as the algorithm reads their rewards (which ones train, `valid`, and their score: the
weighted sum of reward.functions, tokenpo.rewards.weighted), and the correctness of every response drawn, the one
training metric that no algorithm shapes or filters."""

from __future__ import annotations

import torch

from tokenpo.rewards import GOLD_INVALID


def response_scores(verdicts: list[str], scores: list[float | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([N] bool: the response is in the loss, [N] float: its score, or None where the step has no scores and the
    verdict alone is the reward). A response no reward function could judge (score None) stays out of the loss, as
    one whose gold answer does not parse."""
    if not scores:
        return torch.tensor([v != GOLD_INVALID for v in verdicts]), None
    return (torch.tensor([s is not None for s in scores]),
            torch.tensor([0.0 if s is None else s for s in scores], dtype=torch.float32))


def drawn_metrics(counts) -> dict[str, float]:
    """`accuracy/drawn`: the fraction of every response the step generated (all dynamic-sampling rounds, kept or
    filtered out) judged correct, of those whose gold parses: the unshaped correctness, comparable across algorithms
    (`accuracy` and `reward/mean` are the trained batch's, after dynamic sampling's filter and the shaping)."""
    return {"accuracy/drawn": counts.drawn_correct / counts.drawn_judged if counts.drawn_judged else 0.0}
