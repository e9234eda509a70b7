"""Per-token policy-gradient terms ("surrogates"): the clipped PPO/GRPO objective and its 2025 alternatives.

`algorithm.loss.surrogate` names one; `policy_loss` computes the importance ratio of `algorithm.ratio.kind`, hands
the micro-batch to it as `SurrogateInputs` and aggregates the [B, T] per-token loss it returns like any other term.
A surrogate returns its own metrics (what its paper plots: clip or selection fractions, gate values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenpo.algorithms.masked import masked_mean
from tokenpo.registry import Registry

# torch for annotations only: a config validates against this registry before torch is imported
if TYPE_CHECKING:
    import torch

    from tokenpo.algorithms.config import LossConfig

SURROGATES = Registry("policy-gradient surrogate")


@dataclass(frozen=True)
class SurrogateInputs:
    """One micro-batch as a surrogate reads it: [B, T] each."""

    logp: torch.Tensor  # the current policy's log-probs of the sampled tokens, with grad
    old_logp: torch.Tensor  # the rollout policy's, detached
    ratio: torch.Tensor  # the importance ratio of algorithm.ratio.kind, with grad
    advantages: torch.Tensor  # detached, 0 on padding
    mask: torch.Tensor  # float loss mask: 1 on the tokens that train
    loss: LossConfig  # the surrogate's hyperparameters


@dataclass(frozen=True)
class SurrogateTerm:
    """A surrogate's per-token loss [B, T] (unaggregated) and its metrics (scalar tensors, micro-batch means)."""

    loss_tok: torch.Tensor
    metrics: dict[str, torch.Tensor]


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> torch.Tensor:
    """[B, T] L = max(−A·w, −A·clip(w, 1 − ε_low, 1 + ε_high)); with dual clip c and A < 0,
    min(L, −A·c) bounds the loss of a negative token whose ratio exploded.

    The clipped term of the GRPO objective (DeepSeekMath arXiv 2402.03300 §4.1.1), with DAPO's decoupled
    ε_low / ε_high (clip-higher, arXiv 2503.14476 §3.1); dual clip from dual-clip PPO (Ye et al., 2020).
    """
    loss = (-advantages * ratio).maximum(-advantages * ratio.clamp(1 - clip_low, 1 + clip_high))
    if dual_clip is None:
        return loss
    return loss.minimum(-advantages * dual_clip).where(advantages < 0, loss)


def clip_fractions(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> dict[str, torch.Tensor]:
    """Fractions of real tokens whose gradient a clip cuts: low (A < 0, w < 1 − ε_low),
    high (A > 0, w > 1 + ε_high), dual (A < 0, w > c)."""
    ratio = ratio.detach()
    fractions = {
        "clip/low_frac": masked_mean(((advantages < 0) & (ratio < 1 - clip_low)).to(mask.dtype), mask),
        "clip/high_frac": masked_mean(((advantages > 0) & (ratio > 1 + clip_high)).to(mask.dtype), mask),
    }
    if dual_clip is not None:
        fractions["clip/dual_frac"] = masked_mean(((advantages < 0) & (ratio > dual_clip)).to(mask.dtype), mask)
    return fractions


@SURROGATES.register("clipped")
def clipped(inputs: SurrogateInputs) -> SurrogateTerm:
    """The clipped surrogate of PPO/GRPO/DAPO (`clipped_surrogate`) and its clip fractions."""
    loss = inputs.loss
    return SurrogateTerm(
        clipped_surrogate(inputs.ratio, inputs.advantages, loss.clip_low, loss.clip_high, loss.dual_clip),
        clip_fractions(inputs.ratio, inputs.advantages, inputs.mask, loss.clip_low, loss.clip_high, loss.dual_clip))
