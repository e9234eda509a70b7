"""Sampler/trainer mismatch: the rollout engine (vLLM kernels, bf16) and the trainer give the sampled tokens
slightly different log-probs, so the rollouts are a little off-policy even before any update.

`trainer_logp` is the trainer's log-prob of each sampled token under the rollout policy (the old policy),
`sampler_logp` the engine's, both [B, T]; `mask` is 1 on real response tokens.
"""

from __future__ import annotations

import torch

from tokenpo.algorithms.kl import kl_penalty
from tokenpo.algorithms.masked import masked_mean
from tokenpo.algorithms.ratios import LOG_RATIO_CLAMP


def truncated_importance_weight(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """[B, T] detached per-token weight min(π_train / π_sampler, C) that multiplies the policy-gradient loss:
    truncated importance sampling (TIS) of "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (Yao et al., 2025), verl's rollout correction (token-level TIS) and TRL's
    `vllm_importance_sampling_cap`."""
    log_ratio = (trainer_logp - sampler_logp).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_ratio).clamp(max=cap)


def sampler_mismatch(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean |Δ log p| over the sampled tokens, and KL(π_sampler ‖ π_train) estimated on them with k3 (the tokens
    were drawn from the sampler; Schulman, "Approximating KL Divergence", 2020)."""
    trainer_logp, sampler_logp = trainer_logp.detach(), sampler_logp.detach()
    return {
        "mismatch/abs_logp_diff": masked_mean((trainer_logp - sampler_logp).abs(), mask),
        "mismatch/kl": masked_mean(kl_penalty(sampler_logp, trainer_logp, "k3"), mask),
    }
