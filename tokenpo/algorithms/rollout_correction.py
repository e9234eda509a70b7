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
    return importance_weight(trainer_logp, sampler_logp).clamp(max=cap)


def behaviour_weight(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float, mode: str) -> torch.Tensor:
    """[B, T] detached weight of each token's policy-gradient loss, w = π_train / π_sampler: `truncate` min(w, C)
    (TIS, above), `mask` w where w <= C and 0 beyond (AReaL's decoupled PPO: the behaviour importance weight
    π_prox / π_behav, tokens past behav_imp_weight_cap filtered out of the loss; Fu et al., arXiv 2505.24298)."""
    if mode == "truncate":
        return truncated_importance_weight(trainer_logp, sampler_logp, cap)
    weight = importance_weight(trainer_logp, sampler_logp)
    return torch.where(weight <= cap, weight, torch.zeros_like(weight))


def importance_weight(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor) -> torch.Tensor:
    """[B, T] detached π_train / π_sampler of each token, its log clamped as the policy ratio's is."""
    return torch.exp((trainer_logp - sampler_logp).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def sampler_mismatch(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """Mean |Δ log p| over the sampled tokens, and KL(π_sampler ‖ π_train) estimated on them with k3 (the tokens
    were drawn from the sampler; Schulman, "Approximating KL Divergence", 2020)."""
    trainer_logp, sampler_logp = trainer_logp.detach(), sampler_logp.detach()
    return {
        "mismatch/abs_logp_diff": masked_mean((trainer_logp - sampler_logp).abs(), mask),
        "mismatch/kl": masked_mean(kl_penalty(sampler_logp, trainer_logp, "k3"), mask),
    }
