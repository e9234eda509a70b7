"""Token selection of the 2025 entropy-control methods: which tokens of a batch a surrogate treats apart.

Clip-Cov and KL-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617 §4) pick tokens
by the covariance of advantage and log-prob; "80/20" (Wang et al., arXiv 2506.01939 §5) keeps the tokens of highest
entropy. Each function sees one batch: a micro-batch (`selection_scope: micro_batch`, the reference code's) or a
mini-batch of the whole step on every rank (`step`, independent of how the rows are split). Masks are [B, T]; `mask`
is the float loss mask (1 on the tokens that train).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

# torch for annotations only: the config schema imports the surrogate registry, which names these, before torch
if TYPE_CHECKING:
    import torch


def token_covariance(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] Cov(y_t) = (A_t − mean A)·(log π(y_t) − mean log π), both means over the batch's valid tokens
    (arXiv 2505.22617 §4, Eq. 9 summand; verl compute_policy_loss_clip_cov / _kl_cov); 0 off the mask.
    logp is detached: the covariance only selects tokens."""
    valid = (mask > 0).to(logp.dtype)
    count = valid.sum().clamp_min(1.0)
    mean_a = (advantages * valid).sum() / count
    mean_logp = (logp.detach() * valid).sum() / count
    return (advantages - mean_a) * (logp.detach() - mean_logp) * valid


def selection_count(num_tokens: float, rho: float) -> int:
    """k = max(1, ⌊ρ·N⌋) tokens of N valid ones (arXiv 2505.22617 §4: "r·N" clipped / "k·N" penalised tokens; the
    reference keeps at least one); 0 when the batch has no valid token."""
    return max(1, int(rho * num_tokens)) if num_tokens > 0 else 0


def covariance_band(cov: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """[B, T] bool: valid tokens with ω_low < Cov < ω_high, Clip-Cov's candidates (arXiv 2505.22617 §4, Eq. 10)."""
    return (cov > low) & (cov < high) & (mask > 0)


def random_pick(candidates: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T] bool: min(k, #candidates) of the candidates drawn uniformly without replacement (Clip-Cov's random
    pick, arXiv 2505.22617 §4). The uniform keys come from `generator` on the CPU for the whole [B, T], so the same
    seed and shape give the same pick on every device and rank."""
    import torch

    keys = torch.rand(candidates.shape, generator=generator).to(candidates.device)
    return top_k_mask(keys, candidates, k)


def top_k_mask(values: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """[B, T] bool: the min(k, #eligible) eligible tokens of largest `values` (KL-Cov's top-k by covariance,
    arXiv 2505.22617 §4, Eq. 11)."""
    import torch

    picked = torch.zeros_like(eligible, dtype=torch.bool)
    k = min(k, int(eligible.sum()))
    if k == 0:
        return picked
    flat = values.detach().flatten().masked_fill(~eligible.flatten(), float("-inf"))
    picked.view(-1)[flat.topk(k).indices] = True
    return picked


def top_quantile_threshold(values: torch.Tensor, mask: torch.Tensor, frac: float) -> torch.Tensor:
    """Scalar τ: the (1 − ρ)-quantile of `values` over the valid tokens, linearly interpolated like torch.quantile
    (TRL get_high_entropy_mask; τ^B_ρ of arXiv 2506.01939 §5), by a sort (torch.quantile caps its input at 2^24
    elements); +inf when no token is valid."""
    import torch

    valid = values.detach()[mask > 0].float().sort().values
    if valid.numel() == 0:
        return torch.tensor(float("inf"), device=values.device)
    position = (valid.numel() - 1) * (1.0 - frac)
    lo, hi = int(position), min(int(position) + 1, valid.numel() - 1)
    return valid[lo] + (valid[hi] - valid[lo]) * (position - lo)


def entropy_top_mask(entropy: torch.Tensor, mask: torch.Tensor, frac: float) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T] bool, τ): the valid tokens whose entropy H ≥ τ, the batch's (1 − ρ)-quantile, i.e. the top ρ of the
    batch ("80/20": only these carry the policy gradient, arXiv 2506.01939 §5, J_HighEnt's I[H^i_t ≥ τ^B_ρ])."""
    threshold = top_quantile_threshold(entropy, mask, frac)
    return (entropy.detach() >= threshold) & (mask > 0), threshold


def selection_generator(*parts: int) -> torch.Generator:
    """A CPU torch.Generator seeded from integer parts (run seed, step, mini-batch, ...): the same parts give the same
    draws, so a resumed run picks the tokens the uninterrupted one did. A hash, so neighbouring parts do not give
    neighbouring seeds."""
    import torch

    digest = hashlib.sha256(",".join(str(int(part)) for part in parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
