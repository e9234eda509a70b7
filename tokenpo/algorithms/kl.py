"""KL estimators on the sampled token, and the TEPO token-level KL mask."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenpo.algorithms.masked import dense_group_index, group_reduce, masked_mean
from tokenpo.algorithms.ratios import LOG_RATIO_CLAMP
from tokenpo.registry import Registry

# torch for annotations only: a config validates against these registries before torch is imported
if TYPE_CHECKING:
    import torch

    from tokenpo.algorithms.config import AlgorithmConfig

# the spec clamps the per-token estimate so one far-off token cannot dominate the penalty
KL_CLAMP = 10.0

KL_ESTIMATORS = Registry("KL estimator")
KL_MASKS = Registry("KL mask")
ENTROPY_REFERENCES = Registry("KL-mask entropy reference")
# which policy a KL term pulls towards: anchor(old_logp, ref_logp) -> the log-probs it pulls towards
KL_TARGETS = Registry("KL target")


# trait `inert_on_policy`: with one update per rollout the policy trained is the rollout policy, where a KL to it is 0
# and so is its gradient (tokenpo.algorithms.inert)
@KL_TARGETS.register("old", inert_on_policy=True)
def old_anchor(old_logp: torch.Tensor, ref_logp: torch.Tensor | None) -> torch.Tensor:
    """The rollout policy's log-probs."""
    return old_logp


@KL_TARGETS.register("ref")
def ref_anchor(old_logp: torch.Tensor, ref_logp: torch.Tensor | None) -> torch.Tensor | None:
    """The frozen reference policy's log-probs (None where they were not computed)."""
    return ref_logp


@KL_ESTIMATORS.register("k1")
def k1(d: torch.Tensor) -> torch.Tensor:
    """−d, unbiased, can be negative (k1 of Schulman, "Approximating KL Divergence", 2020)."""
    return -d


@KL_ESTIMATORS.register("k2")
def k2(d: torch.Tensor) -> torch.Tensor:
    """d² / 2 (k2 of Schulman, "Approximating KL Divergence", 2020)."""
    return d**2 / 2


@KL_ESTIMATORS.register("k3")
def k3(d: torch.Tensor) -> torch.Tensor:
    """exp(d) − d − 1, unbiased and non-negative (k3: GRPO's KL estimator, DeepSeekMath arXiv 2402.03300
    §4.1.1)."""
    return d.exp() - d - 1


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """[B, T] per-token estimate of KL(π_θ ‖ π_ref) from d = logp_ref − logp_θ, clamped to [−10, 10]: the
    β·D_KL term of the GRPO objective (DeepSeekMath arXiv 2402.03300 §4.1.1), added per token to the loss."""
    d = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return KL_ESTIMATORS.get(estimator)(d).clamp(-KL_CLAMP, KL_CLAMP)


@KL_MASKS.register("none")
def no_kl_mask(advantages, entropy, entropy_ref, mask: torch.Tensor) -> torch.Tensor:
    """No token gets the masked KL term."""
    return mask.new_zeros(mask.shape)


@KL_MASKS.register("tepo", needs_entropy=True)
def tepo_kl_mask(advantages: torch.Tensor, entropy: torch.Tensor, entropy_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TEPO (arXiv 2604.12736; reconstructed from its abstract, no equations published):
    M_{i,t} = [A_{i,t} > 0] · [H_θ(i,t) < H_ref(i,t)] on real tokens."""
    selected = (advantages > 0) & (entropy.detach() < entropy_ref.detach())
    return selected.to(mask.dtype) * mask


# trait `inert_on_policy`: with one update per rollout the current entropy equals the rollout policy's at every token,
# so a mask comparing them selects none (tokenpo.algorithms.inert)
@ENTROPY_REFERENCES.register("old_token", inert_on_policy=True)
def old_token_entropy(old_entropy: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Compare with the old policy's entropy at the same token (TEPO default)."""
    return old_entropy


@ENTROPY_REFERENCES.register("group_mean")
def group_mean_entropy(old_entropy: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Compare with the mean old entropy over the group's real tokens."""
    totals = group_reduce((old_entropy * mask).sum(-1), index)
    counts = group_reduce(mask.sum(-1), index)
    return (totals / counts.clamp_min(1.0)).unsqueeze(-1).expand_as(mask)


@ENTROPY_REFERENCES.register("batch_mean")
def batch_mean_entropy(old_entropy: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Compare with the mean old entropy over the batch's real tokens."""
    return masked_mean(old_entropy, mask).expand_as(mask)


def kl_mask_entropy_reference(
    cfg: AlgorithmConfig, old_entropy: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """[B, T] entropy the KL mask compares H_θ against, per `cfg.loss.kl_mask_entropy_ref`.

    Called once on the whole step batch by `prepare_step` (group and batch means must not see only
    one micro-batch); its slices reach `policy_loss(..., entropy_reference=...)`.
    """
    reference = ENTROPY_REFERENCES.get(cfg.loss.kl_mask_entropy_ref)
    return reference(old_entropy.detach(), mask, dense_group_index(group_ids))
