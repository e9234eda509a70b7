"""Importance ratios [B, T]; sequence-level ratios are broadcast to every token of their sequence."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenpo.algorithms.masked import sequence_mean
from tokenpo.registry import Registry

# torch for annotations only: a config validates against these registries before torch is imported
if TYPE_CHECKING:
    import torch

# exp of a log ratio beyond this overflows or drowns the batch; the spec clamps before exp
LOG_RATIO_CLAMP = 20.0

RATIOS = Registry("importance ratio")
# trait `inert_on_policy`: with one update per rollout the ratio is 1 on every response, so choosing this kind over the
# token ratio changes nothing (tokenpo.algorithms.inert)


def exp_clamped(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def per_token(per_sequence: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T]: the sequence's value on every position."""
    return per_sequence.unsqueeze(-1).expand_as(like)


@RATIOS.register("token")
def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w_{i,t} = π_θ(o_{i,t}) / π_old(o_{i,t}) (PPO / GRPO token ratio: DeepSeekMath arXiv 2402.03300 §4.1.1,
    the ratio inside the GRPO objective)."""
    return exp_clamped(logp - old_logp)


@RATIOS.register("sequence_arithmetic", inert_on_policy=True)
def sequence_arithmetic_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ŵ_i = mean_t w_{i,t} (GRPO-S sequence ratio, GTPO paper arXiv 2508.04349 App. C)."""
    return per_token(sequence_mean(token_ratio(logp, old_logp, mask), mask), logp)


@RATIOS.register("sequence_geometric", inert_on_policy=True)
def sequence_geometric_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_i = exp(mean_t log w_{i,t}) (GSPO sequence ratio, used in its objective Eq. 5, arXiv 2507.18071;
    GRPO-S geometric option, App. C)."""
    return per_token(exp_clamped(sequence_mean(logp - old_logp, mask)), logp)


@RATIOS.register("sequence_token", inert_on_policy=True)
def sequence_token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_{i,t} = sg[s_i] · π_θ(o_{i,t}) / sg[π_θ(o_{i,t})] (GSPO-token, arXiv 2507.18071; TEPO reconstruction):
    the value of the geometric sequence ratio with the gradient of each token's own log-prob."""
    log_s = sequence_mean(logp - old_logp, mask).detach()
    return exp_clamped(per_token(log_s, logp) + logp - logp.detach())


def importance_ratio(kind: str, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] ratio of the registered `kind` (token | sequence_arithmetic | sequence_geometric | sequence_token)."""
    return RATIOS.get(kind)(logp, old_logp, mask)
