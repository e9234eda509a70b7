"""Advantages per token [B, T]: GRPO group advantage, GTPO token entropy rewards, GRPO-S.

`entropy` is the old policy's per-token entropy H_{i,t}; it only weights rewards, so it is
always detached (the gradient flows through the ratio, never through an advantage).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable

from tokenpo.algorithms.masked import dense_group_index, group_reduce, sequence_mean
from tokenpo.registry import Registry

# torch for annotations only: a config validates against these registries before torch is imported
if TYPE_CHECKING:
    from torch import Tensor

    from tokenpo.algorithms.config import AdvantageConfig, AlgorithmConfig

SCALES = ("std", "none")

# estimator(cfg.advantage, rewards [B], correct [B] bool, dense group index [B], mask, entropy) -> [B, T]
# trait `needs_group`: the estimator compares a response with the other responses to its prompt, so one response per
# prompt (rollout.group_size=1) gets advantage 0 and nothing trains; True, or a function of the AdvantageConfig giving
# the setting that makes it so (None: it does not)
ADVANTAGES = Registry("advantage estimator")
# norm(token rewards r̃ [B, T], pools [B, T], positive [B, T] bool, standardize) -> advantages [B, T];
# standardize(values, pools=, center=) is pooled_standardize with the step's weights, scale and eps bound
GTPO_NORMS = Registry("GTPO normalisation")
# scope(dense group index [B]) -> pool id [B]: the responses one statistic or one entropy share runs over
SCOPES = Registry("scope")
STATS_WEIGHTS = Registry("statistics weighting")

# float sums of 1/|o_i| land a hair off the integer member count; a pool needs two members
_SINGLE_MEMBER_SLACK = 1e-4


def pooled_standardize(
    values: Tensor,
    weights: Tensor,
    pools: Tensor,
    *,
    center: bool,
    scale: bool,
    eps: float,
) -> Tensor:
    """(x − mean_p) / (std_p + eps) within each pool p (all tensors of one shape).

    Statistics are weighted by `weights` (0 leaves an entry out); std is unbiased,
    sqrt(Σ w (x − μ)² / (Σ w − 1)). `center=False` keeps x (only divides), `scale=False` skips
    the division. A pool whose weights sum to one member or less has no spread to measure and
    yields 0 (a GRPO group of size 1 gets advantage 0).
    """
    x, w, p = values.reshape(-1), weights.reshape(-1), pools.reshape(-1)
    total = group_reduce(w, p)
    mean = group_reduce(w * x, p) / total.clamp_min(_SINGLE_MEMBER_SLACK)
    deviation = x - mean
    out = deviation if center else x
    if scale:
        variance = group_reduce(w * deviation**2, p) / (total - 1).clamp_min(_SINGLE_MEMBER_SLACK)
        out = out / (variance.sqrt() + eps)
    out = out.where(total > 1 + _SINGLE_MEMBER_SLACK, out.new_zeros(()))
    return out.view_as(values)


def group_advantages(rewards: Tensor, group_ids: Tensor, scale: str = "std", eps: float = 1e-6) -> Tensor:
    """GRPO group advantage [B]: A_i = (R_i − mean_g R) / (std_g R + eps), unbiased std (outcome supervision,
    DeepSeekMath arXiv 2402.03300 §4.1.2); scale="none" drops the std (Dr. GRPO, arXiv 2503.20783).
    A group of size 1 gets 0."""
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; known: {', '.join(SCALES)}")
    index = dense_group_index(group_ids)
    return pooled_standardize(rewards, rewards.new_ones(rewards.shape), index, center=True, scale=scale == "std", eps=eps)


def entropy_weighted_rewards(
    rewards: Tensor,
    correct: Tensor,
    index: Tensor,
    entropy: Tensor,
    active: Tensor,
    weight1: float,
    weight2: float,
    eps: float,
) -> Tensor:
    """Dynamic entropy weighting, shared by GTPO (per position t) and GRPO-S (per sequence).

    `entropy` and `active` are [B, T] (GTPO: H_{i,t}, mask) or [B] (GRPO-S: Ĥ_i, non-empty);
    `rewards` and `correct` are [B] or [B, 1] to broadcast against them. `index` [B] names the
    pool the shares and counts run over (a group, or one pool for the whole batch). Within each pool:
      O+ : w1·R_i + w2 · H_i / Σ_{k∈O+ active} H_k · d       (GTPO Eq. 3; d = active O+ count)
      O− : w1·R_j − w2 · (1/H_j) / Σ_{k∈O− active} (1/H_k) · h  (GTPO Eq. 5; h = active O− count)
    With the paper's rewards R = ±1 the O− base term is −w1. Inactive entries are 0. The count
    scales with the pool, so the bonus (penalty) averages w2 per active O+ (O−) entry at each t.
    """
    positive = correct * active
    negative = ~correct * active
    inverse = 1.0 / (entropy + eps)
    bonus = weight2 * entropy / (group_reduce(positive * entropy, index) + eps) * group_reduce(positive, index)
    penalty = weight2 * inverse / (group_reduce(negative * inverse, index) + eps) * group_reduce(negative, index)
    return weight1 * rewards * active + positive * bonus - negative * penalty


@ADVANTAGES.register("grpo", needs_group=True)
def grpo_advantages(
    cfg: AdvantageConfig, rewards: Tensor, correct: Tensor, index: Tensor, mask: Tensor, entropy: Tensor | None
) -> Tensor:
    """GRPO: the group advantage on every token of the response."""
    return group_advantages(rewards, index, cfg.scale, cfg.eps).unsqueeze(-1) * mask


@ADVANTAGES.register("gtpo", needs_entropy=True, needs_group=lambda cfg: (
    f"algorithm.advantage.scope={cfg.scope}" if SCOPES.trait(cfg.scope, "per_group") else None))
def gtpo_advantages(
    cfg: AdvantageConfig, rewards: Tensor, correct: Tensor, index: Tensor, mask: Tensor, entropy: Tensor | None
) -> Tensor:
    """GTPO: entropy-weighted token rewards (Eq. 3, 5; shares over `share_scope`) standardised
    per `norm` over `scope` (Eq. 6)."""
    share_pools = SCOPES.get(cfg.share_scope)(index)
    token_rewards = entropy_weighted_rewards(
        rewards.unsqueeze(-1), correct.unsqueeze(-1), share_pools, entropy, mask, cfg.alpha1, cfg.alpha2, cfg.eps
    )
    weights = STATS_WEIGHTS.get(cfg.stats_weight)(mask)
    standardize = partial(pooled_standardize, weights=weights, scale=cfg.scale == "std", eps=cfg.eps)
    pools = SCOPES.get(cfg.scope)(index).unsqueeze(-1).expand_as(mask)
    advantages = GTPO_NORMS.get(cfg.norm)(token_rewards, pools, correct.unsqueeze(-1).expand_as(mask), standardize)
    return advantages * mask


@ADVANTAGES.register("grpo_s", needs_entropy=True, needs_group=True)
def grpo_s_advantages(
    cfg: AdvantageConfig, rewards: Tensor, correct: Tensor, index: Tensor, mask: Tensor, entropy: Tensor | None
) -> Tensor:
    """GRPO-S: rewards from the sequence entropy Ĥ_i = mean_t H_{i,t} (shares over
    `share_scope`), standardised jointly over the group's non-empty responses (sign kept),
    broadcast to tokens."""
    non_empty = (mask.sum(-1) > 0).to(mask.dtype)
    share_pools = SCOPES.get(cfg.share_scope)(index)
    sequence_rewards = entropy_weighted_rewards(
        rewards, correct, share_pools, sequence_mean(entropy, mask), non_empty, cfg.beta1, cfg.beta2, cfg.eps
    )
    advantages = pooled_standardize(sequence_rewards, non_empty, index, center=True, scale=cfg.scale == "std", eps=cfg.eps)
    return advantages.unsqueeze(-1) * mask


@SCOPES.register("group", per_group=True)
def group_scope(index: Tensor) -> Tensor:
    """One prompt's responses."""
    return index


@SCOPES.register("batch")
def batch_scope(index: Tensor) -> Tensor:
    """The whole step batch (GTPO §4: entropy compared at batch level)."""
    return index.new_zeros(index.shape)


@GTPO_NORMS.register("joint")
def joint_norm(token_rewards: Tensor, pools: Tensor, positive: Tensor, standardize: Callable[..., Tensor]) -> Tensor:
    """One mean/std over O+ ∪ O− tokens: keeps the ±α1 correctness sign."""
    return standardize(token_rewards, pools=pools, center=True)


@GTPO_NORMS.register("per_polarity")
def per_polarity_norm(token_rewards: Tensor, pools: Tensor, positive: Tensor, standardize: Callable[..., Tensor]) -> Tensor:
    """GTPO Eq. 6, reading (a): O+ and O− each over their own tokens only; each becomes
    zero-mean, which erases the ±α1 correctness signal (all 0 at α2 = 0)."""
    return standardize(token_rewards, pools=pools * 2 + positive.long(), center=True)


@GTPO_NORMS.register("per_polarity_padded")
def per_polarity_padded_norm(
    token_rewards: Tensor, pools: Tensor, positive: Tensor, standardize: Callable[..., Tensor]
) -> Tensor:
    """GTPO Eq. 6, reading (b): r̃+ and r̃− each over all tokens of the pool, the other
    polarity's tokens counting as 0; keeps the sign and equals joint at α2 = 0."""
    zero = token_rewards.new_zeros(())
    positive_part = standardize(token_rewards.where(positive, zero), pools=pools, center=True)
    negative_part = standardize(token_rewards.where(~positive, zero), pools=pools, center=True)
    return positive_part.where(positive, negative_part)


@GTPO_NORMS.register("scale_only")
def scale_only_norm(token_rewards: Tensor, pools: Tensor, positive: Tensor, standardize: Callable[..., Tensor]) -> Tensor:
    """Divide by the joint std without subtracting the mean."""
    return standardize(token_rewards, pools=pools, center=False)


@STATS_WEIGHTS.register("sequence")
def sequence_weights(mask: Tensor) -> Tensor:
    """Each response counts once (its tokens weigh 1/|o_i|): with α2 = 0 GTPO equals DAPO."""
    return mask / mask.sum(-1, keepdim=True).clamp_min(1.0)


@STATS_WEIGHTS.register("token")
def token_weights(mask: Tensor) -> Tensor:
    """Each token counts once: long responses dominate the mean and std."""
    return mask


def entropy_shaped_advantages(advantages: Tensor, entropy: Tensor, alpha: float, kappa: float) -> Tensor:
    """[B, T] A + ψ(H), ψ(H) = min(α · sg(H), |A| / κ): the entropy-based advantage of Cheng et al. ("Reasoning
    with Exploration: An Entropy Perspective", arXiv 2506.14758, entropy-based advantage shaping). ψ ≥ 0 rewards
    uncertain tokens; the |A|/κ cap (κ > 1) keeps A's sign (a negative A stays in [A, A + |A|/κ]) and gives A = 0
    (padding, a zero-variance group) no term. H is detached: ψ only weights the policy gradient."""
    return advantages + (alpha * entropy.detach()).minimum(advantages.abs() / kappa)


def token_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    correct: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    entropy: Tensor | None = None,
) -> Tensor:
    """[B, T] advantages from the estimator named by `cfg.advantage.estimator` (0 on padding), plus the
    entropy-based term when `cfg.advantage.entropy_bonus_alpha` > 0."""
    adv_cfg = cfg.advantage
    name = adv_cfg.estimator
    estimator = ADVANTAGES.get(name)
    if entropy is None and (ADVANTAGES.trait(name, "needs_entropy") or adv_cfg.entropy_bonus_alpha > 0):
        raise ValueError(f"advantage estimator {name!r} (entropy_bonus_alpha={adv_cfg.entropy_bonus_alpha}) needs the "
                         "old policy's per-token entropy; got entropy=None")
    entropy = None if entropy is None else entropy.detach().to(mask.dtype)
    advantages = estimator(adv_cfg, rewards.detach().to(mask.dtype), correct.bool(), dense_group_index(group_ids),
                           mask, entropy)
    if adv_cfg.entropy_bonus_alpha > 0:
        advantages = entropy_shaped_advantages(advantages, entropy, adv_cfg.entropy_bonus_alpha,
                                               adv_cfg.entropy_bonus_kappa) * mask
    return advantages
