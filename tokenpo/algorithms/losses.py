"""Policy loss: the configured surrogate (tokenpo.algorithms.surrogates) on the configured ratio, optional KL, TEPO masked KL and entropy bonus,
aggregated by the configured mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tokenpo.algorithms.aggregation import LossNorm, aggregate
from tokenpo.algorithms.kl import KL_MASKS, KL_TARGETS, kl_penalty
from tokenpo.algorithms.masked import masked_mean
from tokenpo.algorithms.ratios import importance_ratio
from tokenpo.algorithms.rollout_correction import behaviour_weight, importance_weight, sampler_mismatch
from tokenpo.algorithms.selection import entropy_top_mask
from tokenpo.algorithms.surrogates import SURROGATES, SelectionInputs, SurrogateInputs

if TYPE_CHECKING:
    from tokenpo.algorithms.config import AlgorithmConfig


def _kl_anchor(target: str, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, key: str) -> torch.Tensor:
    """The log-probs a KL term pulls towards; fails loudly when the reference was not computed."""
    anchor = KL_TARGETS.get(target)(old_logp, ref_logp)
    if anchor is None:
        raise ValueError(f"{key} is {target!r} but policy_loss got ref_logp=None")
    return anchor


def entropy_bonus(entropy: torch.Tensor, coef: float) -> torch.Tensor:
    """[B, T] −c2 · S[π_θ] per token: the entropy bonus of the PPO objective L^{CLIP+VF+S} (arXiv 1707.06347
    Eq. 9), as a loss (verl's entropy_coeff, cleanrl's ent_coef); c2 > 0 rewards exploration."""
    return -coef * entropy


def policy_loss(
    cfg: AlgorithmConfig,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    norm: LossNorm,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_reference: torch.Tensor | None = None,
    sampler_logp: torch.Tensor | None = None,
    entropy_coef: float | None = None,
    selection: torch.Tensor | None = None,
    entropy_keep: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar loss of one micro-batch (its share of the step; sum over micro-batches) and metrics.

    logp: [B, T] current log-probs of the sampled tokens (with grad); old_logp, ref_logp: [B, T]
    of the rollout and reference policies; advantages: [B, T]; entropy: [B, T] current entropy,
    needed by a KL mask and by the entropy bonus (`loss.entropy_coef`, which needs it with grad);
    entropy_reference: [B, T] from `kl_mask_entropy_reference`, needed only by a KL mask.
    sampler_logp: [B, T] the rollout engine's log-probs of the sampled tokens, where it returns them: the
    sampler/trainer mismatch is logged, and `loss.tis_cap` weights the policy-gradient term by TIS.
    entropy_coef: the entropy bonus's coefficient this step (None: `loss.entropy_coef`; adaptive entropy control
    passes its own, the config stays frozen).
    selection, entropy_keep: [B, T] bool, the step-wide picks of a selecting surrogate and of the 80/20 mask
    (`loss.selection_scope: step`); None: picked here on this micro-batch (the current log-probs and entropy;
    `generator` draws Clip-Cov's random pick).
    Metrics are this micro-batch's own means (average them over micro-batches).
    """
    loss_cfg = cfg.loss
    old_logp, advantages = old_logp.detach(), advantages.detach()
    ratio = importance_ratio(cfg.ratio.kind, logp, old_logp, mask)
    select = SURROGATES.trait(loss_cfg.surrogate, "select")
    if select is not None and selection is None:
        selection = select(SelectionInputs(advantages, logp.detach(), ratio.detach(), mask, loss_cfg, generator))
    surrogate = SURROGATES.get(loss_cfg.surrogate)(
        SurrogateInputs(logp, old_logp, ratio, advantages, mask, loss_cfg, selection))
    pg_tok, metrics = surrogate.loss_tok, dict(surrogate.metrics)
    if loss_cfg.entropy_top_frac is not None:
        if entropy_keep is None:
            if entropy is None:
                raise ValueError("algorithm.loss.entropy_top_frac needs the current entropy; got None")
            entropy_keep, metrics["entropy_top/threshold"] = entropy_top_mask(entropy, mask, loss_cfg.entropy_top_frac)
        # 80/20 (arXiv 2506.01939 §5): the other tokens carry no policy gradient but stay in the normaliser
        pg_tok = pg_tok * entropy_keep.to(pg_tok.dtype)
        metrics["entropy_top/kept_frac"] = masked_mean(entropy_keep.to(mask.dtype), mask)
        if entropy is not None:
            metrics["entropy_top/kept_entropy_mean"] = masked_mean(entropy.detach(), mask * entropy_keep)
    metrics["kl/old"] = masked_mean(kl_penalty(logp.detach(), old_logp, "k3"), mask)
    if ref_logp is not None:
        ref_logp = ref_logp.detach()
        metrics["kl/ref"] = masked_mean(kl_penalty(logp.detach(), ref_logp, "k3"), mask)
    if sampler_logp is not None:
        metrics.update(sampler_mismatch(old_logp, sampler_logp, mask))
        if loss_cfg.tis_cap is not None:
            raw = importance_weight(old_logp, sampler_logp)
            tis = behaviour_weight(old_logp, sampler_logp, loss_cfg.tis_cap, loss_cfg.tis_mode)
            pg_tok = pg_tok * tis
            metrics["tis/weight_mean"] = masked_mean(tis, mask)
            # the raw weight's largest value, and the share of tokens past the cap (truncated, or masked out)
            metrics["tis/raw_weight_max"] = (raw * mask).max() if bool(mask.any()) else raw.new_zeros(())
            metrics["tis/capped_frac"] = masked_mean((raw >= loss_cfg.tis_cap).to(mask.dtype), mask)

    kl_tok = torch.zeros_like(pg_tok)
    if loss_cfg.kl_coef:
        anchor = _kl_anchor(loss_cfg.kl_target, old_logp, ref_logp, "algorithm.loss.kl_target")
        kl_tok = kl_tok + loss_cfg.kl_coef * kl_penalty(logp, anchor, loss_cfg.kl_estimator)
    if loss_cfg.kl_mask_coef:
        if KL_MASKS.trait(loss_cfg.kl_mask, "needs_entropy") and (entropy is None or entropy_reference is None):
            raise ValueError(f"KL mask {loss_cfg.kl_mask!r} needs entropy and entropy_reference; got None")
        kl_mask = KL_MASKS.get(loss_cfg.kl_mask)(advantages, entropy, entropy_reference, mask)
        anchor = _kl_anchor(loss_cfg.kl_mask_target, old_logp, ref_logp, "algorithm.loss.kl_mask_target")
        kl_tok = kl_tok + loss_cfg.kl_mask_coef * kl_mask * kl_penalty(logp, anchor, loss_cfg.kl_estimator)
        metrics["tepo/mask_frac"] = masked_mean(kl_mask, mask)

    loss = aggregate(pg_tok + kl_tok, mask, cfg.aggregation, norm)
    local_norm = LossNorm.from_mask(mask, norm.max_len)
    metrics["loss/pg"] = aggregate(pg_tok.detach(), mask, cfg.aggregation, local_norm)
    metrics["loss/kl"] = aggregate(kl_tok.detach(), mask, cfg.aggregation, local_norm)
    entropy_coef = loss_cfg.entropy_coef if entropy_coef is None else entropy_coef
    if entropy_coef:
        if entropy is None or not entropy.requires_grad:
            raise ValueError("algorithm.loss.entropy_coef needs the current entropy with its gradient; got "
                             f"{'None' if entropy is None else 'a detached tensor'}")
        # a separate aggregate: with the coefficient at 0 the loss is the same sum as without the option
        bonus_tok = entropy_bonus(entropy, entropy_coef)
        loss = loss + aggregate(bonus_tok, mask, cfg.aggregation, norm)
        metrics["loss/entropy"] = aggregate(bonus_tok.detach(), mask, cfg.aggregation, local_norm)
    values = torch.stack([value.detach().float() for value in metrics.values()]).tolist()  # one transfer
    return loss, dict(zip(metrics, values))
