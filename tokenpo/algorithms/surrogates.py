"""Per-token policy-gradient terms ("surrogates"): the clipped PPO/GRPO objective and its 2025 alternatives.

`algorithm.loss.surrogate` names one; `policy_loss` computes the importance ratio of `algorithm.ratio.kind`, hands
the micro-batch to it as `SurrogateInputs` and aggregates the [B, T] per-token loss it returns like any other term.
A surrogate returns its own metrics (what its paper plots: clip or selection fractions, gate values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenpo.algorithms.masked import masked_mean, sequence_mean
from tokenpo.algorithms.ratios import exp_clamped, per_token
from tokenpo.algorithms.selection import (covariance_band, random_pick, selection_count, token_covariance,
                                          top_k_mask)
from tokenpo.registry import Registry

# torch for annotations only: a config validates against this registry before torch is imported
if TYPE_CHECKING:
    import torch

    from tokenpo.algorithms.config import LossConfig

SURROGATES = Registry("policy-gradient surrogate")
# trait `inert_on_policy`: the keys of algorithm.loss a surrogate reads only through an importance ratio away from 1
# (its clip or gate); with one update per rollout every ratio is 1 and they do nothing (tokenpo.algorithms.inert)
CLIP_KEYS = ("clip_low", "clip_high", "dual_clip")


@dataclass(frozen=True)
class SurrogateInputs:
    """One micro-batch as a surrogate reads it: [B, T] each."""

    logp: torch.Tensor  # the current policy's log-probs of the sampled tokens, with grad
    old_logp: torch.Tensor  # the rollout policy's, detached
    ratio: torch.Tensor  # the importance ratio of algorithm.ratio.kind, with grad
    advantages: torch.Tensor  # detached, 0 on padding
    mask: torch.Tensor  # float loss mask: 1 on the tokens that train
    loss: LossConfig  # the surrogate's hyperparameters
    # [B, T] bool: the tokens a selecting surrogate (trait `select`) treats apart, from its `select` on the micro-batch
    # or on the whole step (algorithm.loss.selection_scope); None for the others
    selection: torch.Tensor | None = None


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


@SURROGATES.register("clipped", inert_on_policy=CLIP_KEYS)
def clipped(inputs: SurrogateInputs) -> SurrogateTerm:
    """The clipped surrogate of PPO/GRPO/DAPO (`clipped_surrogate`) and its clip fractions."""
    loss = inputs.loss
    return SurrogateTerm(
        clipped_surrogate(inputs.ratio, inputs.advantages, loss.clip_low, loss.clip_high, loss.dual_clip),
        clip_fractions(inputs.ratio, inputs.advantages, inputs.mask, loss.clip_low, loss.clip_high, loss.dual_clip))



def cispo_weight(ratio: torch.Tensor, clip_low: float | None, clip_high: float) -> torch.Tensor:
    """[B, T] ŵ = sg(clip(r, 1 − ε_low^IS, 1 + ε_high^IS)); clip_low None: no lower bound (the paper's choice)."""
    return ratio.detach().clamp(None if clip_low is None else 1 - clip_low, 1 + clip_high)


def cispo_surrogate(weight: torch.Tensor, logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """[B, T] L = −ŵ·A·log π_θ with ŵ detached (`cispo_weight`): REINFORCE weighted by the clipped IS weight, so
    the gradient −ŵ·A·∇log π reaches every token, none is dropped by the clip.

    CISPO, MiniMax-M1 arXiv 2506.13585 §3.1 (the J_CISPO objective).
    """
    return -weight * advantages * logp


@SURROGATES.register("cispo", inert_on_policy=("cispo_clip_low", "cispo_clip_high"))
def cispo(inputs: SurrogateInputs) -> SurrogateTerm:
    """CISPO on the ratio of algorithm.ratio.kind (the paper's: token). Reproduces the paper with `token-mean`
    (J_CISPO's 1/Σ_i|o_i|). Metrics: fraction of real tokens whose weight the clip changed, mean weight ŵ."""
    loss = inputs.loss
    weight = cispo_weight(inputs.ratio, loss.cispo_clip_low, loss.cispo_clip_high)
    clipped = (weight != inputs.ratio.detach()).to(inputs.mask.dtype)
    return SurrogateTerm(
        cispo_surrogate(weight, inputs.logp, inputs.advantages),
        {"cispo/clipped_frac": masked_mean(clipped, inputs.mask), "cispo/weight_mean": masked_mean(weight, inputs.mask)})


def gmpo_clipped_log_ratio(
    log_ratio: torch.Tensor, sign: torch.Tensor, clip_low: float, clip_high: float,
) -> torch.Tensor:
    """[B, T] sgn(A)·min(sgn(A)·log r_t, sgn(A)·clip(log r_t, −ε_l, ε_h)): the token clip of GMPO in log space,
    one-sided by the sign of the sequence's advantage (A > 0 caps log r at ε_h, A < 0 floors it at −ε_l).

    GMPO arXiv 2507.20673, the J_GMPO objective (clip range (e^−ε_l, e^ε_h), paper: e^±0.4).
    """
    return sign * (sign * log_ratio).minimum(sign * log_ratio.clamp(-clip_low, clip_high))


def gmpo_sequence_ratio(clipped_log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] ρ_i = exp(mean_t clipped log r_t) = (Π_t clipped r_t)^(1/|o_i|): the geometric mean of the token ratios
    (GMPO arXiv 2507.20673, J_GMPO); the log-mean is clamped like every ratio before exp."""
    return exp_clamped(sequence_mean(clipped_log_ratio, mask))


@SURROGATES.register("gmpo", own_ratio=True, inert_on_policy=("gmpo_clip_low", "gmpo_clip_high"))
def gmpo(inputs: SurrogateInputs) -> SurrogateTerm:
    """GMPO: L_i = −A_i·ρ_i (`gmpo_sequence_ratio`), written on every token of response i, so that
    `seq-mean-token-mean` (the row's token mean is L_i, then the mean over responses) reproduces the paper's
    1/G Σ_i; the gradient of token t is −A_i·ρ_i/|o_i|·∇log π_t where its log ratio is not clipped.

    A_i is the mean of the row's advantages (the GRPO advantage is constant on a row); the per-token log ratio is
    log π_θ − log π_old, GMPO's own: it reads no algorithm.ratio.kind, which the schema requires to be token.
    Metrics: fractions of real tokens whose gradient the clip cuts (high: A > 0 and log r > ε_h; low: A < 0 and
    log r < −ε_l) and the mean ρ_i over the responses.
    """
    loss = inputs.loss
    advantage = sequence_mean(inputs.advantages, inputs.mask)
    sign = per_token(advantage.sign(), inputs.logp)
    log_ratio = inputs.logp - inputs.old_logp
    ratio = gmpo_sequence_ratio(gmpo_clipped_log_ratio(log_ratio, sign, loss.gmpo_clip_low, loss.gmpo_clip_high),
                                inputs.mask)
    log_ratio, mask = log_ratio.detach(), inputs.mask
    responses = (mask.sum(-1) > 0).to(mask.dtype)
    return SurrogateTerm(
        per_token(-advantage * ratio, inputs.logp),
        {"gmpo/clip_high_frac": masked_mean(((sign > 0) & (log_ratio > loss.gmpo_clip_high)).to(mask.dtype), mask),
         "gmpo/clip_low_frac": masked_mean(((sign < 0) & (log_ratio < -loss.gmpo_clip_low)).to(mask.dtype), mask),
         "gmpo/ratio_mean": (ratio.detach() * responses).sum() / responses.sum().clamp_min(1.0)})


def sapo_temperature(advantages: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """[B, T] τ_t: τ_pos where A > 0, τ_neg otherwise (SAPO arXiv 2511.20347: τ_neg > τ_pos damps negative updates
    faster)."""
    return tau_neg + (tau_pos - tau_neg) * (advantages > 0).to(advantages.dtype)


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """[B, T] f(r) = σ(τ·(r − 1))·4/τ: the soft gate replacing the clip (SAPO arXiv 2511.20347, the J_SAPO
    objective). f'(1) = 1, so at r = 1 the gradient is the plain policy gradient whatever τ."""
    return (tau * (ratio - 1)).sigmoid() * (4 / tau)


def sapo_gradient_weight(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """[B, T] r·f'(r) = r·4σ(τ(r − 1))(1 − σ(τ(r − 1))): the weight of −A·∇log π in the gradient of −f(r)·A."""
    gate = (tau * (ratio - 1)).sigmoid()
    return ratio * 4 * gate * (1 - gate)


@SURROGATES.register("sapo", inert_on_policy=("sapo_tau_pos", "sapo_tau_neg"))
def sapo(inputs: SurrogateInputs) -> SurrogateTerm:
    """SAPO: L = −f(r)·A (`sapo_gate`) on the ratio of algorithm.ratio.kind (the paper's: token); reproduces the paper
    with `seq-mean-token-mean`. Metrics: mean gate f(r) and mean gradient weight r·f'(r), overall and per polarity
    (pos: A > 0, neg: A < 0; 0 for a polarity without tokens)."""
    loss, mask, advantages = inputs.loss, inputs.mask, inputs.advantages
    tau = sapo_temperature(advantages, loss.sapo_tau_pos, loss.sapo_tau_neg)
    ratio = inputs.ratio.detach()
    gradient_weight = sapo_gradient_weight(ratio, tau)
    return SurrogateTerm(
        -sapo_gate(inputs.ratio, tau) * advantages,
        {"sapo/gate_mean": masked_mean(sapo_gate(ratio, tau), mask),
         "sapo/grad_weight_mean": masked_mean(gradient_weight, mask),
         "sapo/grad_weight_pos": masked_mean(gradient_weight, mask * (advantages > 0).to(mask.dtype)),
         "sapo/grad_weight_neg": masked_mean(gradient_weight, mask * (advantages < 0).to(mask.dtype))})
# --- selecting surrogates: a `select` trait picks tokens, the surrogate treats them apart ---

@dataclass(frozen=True)
class SelectionInputs:
    """One batch as a `select` reads it, [B, T] each, all detached: a micro-batch (selection_scope micro_batch, the
    reference code's) or one mini-batch of the whole step (step)."""

    advantages: torch.Tensor
    logp: torch.Tensor  # the log-probs the covariance reads: the current policy's (micro_batch), the rollout's (step)
    ratio: torch.Tensor  # the importance ratio the ordinary clip reads (all ones at step scope: logp is the rollout's)
    mask: torch.Tensor  # float loss mask; its sum is N of k = max(1, ⌊ρ·N⌋)
    loss: LossConfig
    generator: torch.Generator | None  # the random pick's draws (Clip-Cov), seeded from run seed, step and batch


def ordinary_clip_active(ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float,
                         clip_high: float) -> torch.Tensor:
    """[B, T] bool: tokens whose clipped term is the larger, −A·clip(w) > −A·w, i.e. those the ordinary clip already
    cuts (verl clip_by_origin)."""
    return -advantages * ratio.clamp(1 - clip_low, 1 + clip_high) > -advantages * ratio


def clip_cov_selection(inputs: SelectionInputs) -> torch.Tensor:
    """[B, T] bool: Clip-Cov's tokens (arXiv 2505.22617 §4, Eq. 10): k = max(1, ⌊ρ·N⌋) drawn at random among the
    valid tokens with ω_low < Cov < ω_high that the ordinary clip did not cut."""
    loss = inputs.loss
    if inputs.generator is None:
        raise ValueError("clip_cov's random pick needs a torch.Generator; got None")
    cov = token_covariance(inputs.advantages, inputs.logp, inputs.mask)
    candidates = covariance_band(cov, inputs.mask, loss.cov_clip_low, loss.cov_clip_high) & ~ordinary_clip_active(
        inputs.ratio, inputs.advantages, loss.clip_low, loss.clip_high)
    return random_pick(candidates, selection_count(float(inputs.mask.sum()), loss.cov_rho), inputs.generator)


def kl_cov_selection(inputs: SelectionInputs) -> torch.Tensor:
    """[B, T] bool: KL-Cov's tokens (arXiv 2505.22617 §4, Eq. 11): the k = max(1, ⌊ρ·N⌋) valid tokens of largest
    Cov."""
    cov = token_covariance(inputs.advantages, inputs.logp, inputs.mask)
    return top_k_mask(cov, inputs.mask > 0, selection_count(float(inputs.mask.sum()), inputs.loss.cov_rho))


def _selection(inputs: SurrogateInputs, name: str) -> torch.Tensor:
    if inputs.selection is None:
        raise ValueError(f"surrogate {name!r} needs SurrogateInputs.selection (its `select` trait's tokens); got None")
    return inputs.selection


def covariance_metrics(inputs: SurrogateInputs, selected: torch.Tensor, name: str) -> dict[str, torch.Tensor]:
    """What arXiv 2505.22617 plots beside entropy: the fraction of tokens selected and the mean Cov over the valid
    tokens of this micro-batch (current log-probs)."""
    return {f"{name}/selected_frac": masked_mean(selected.to(inputs.mask.dtype), inputs.mask),
            "cov/mean": masked_mean(token_covariance(inputs.advantages, inputs.logp, inputs.mask), inputs.mask)}


@SURROGATES.register("clip_cov", select=clip_cov_selection, inert_on_policy=CLIP_KEYS)
def clip_cov(inputs: SurrogateInputs) -> SurrogateTerm:
    """Clip-Cov (arXiv 2505.22617 §4, Eq. 10): the clipped surrogate with the gradient of the selected tokens stopped
    (their loss is 0; they stay in the normaliser, as verl's corr = 0)."""
    loss, selected = inputs.loss, _selection(inputs, "clip_cov")
    pg = clipped_surrogate(inputs.ratio, inputs.advantages, loss.clip_low, loss.clip_high, loss.dual_clip)
    metrics = clip_fractions(inputs.ratio, inputs.advantages, inputs.mask, loss.clip_low, loss.clip_high,
                             loss.dual_clip)
    return SurrogateTerm(pg * (~selected).to(pg.dtype), {**metrics, **covariance_metrics(inputs, selected, "clip_cov")})


@SURROGATES.register("kl_cov", select=kl_cov_selection, inert_on_policy=("kl_cov_coef",))
def kl_cov(inputs: SurrogateInputs) -> SurrogateTerm:
    """KL-Cov (arXiv 2505.22617 §4, Eq. 11): −A·w on every token, plus β·|log π_θ − log π_old| on the selected ones;
    no clip (verl compute_policy_loss_kl_cov)."""
    selected = _selection(inputs, "kl_cov")
    penalty = inputs.loss.kl_cov_coef * (inputs.logp - inputs.old_logp).abs() * selected.to(inputs.logp.dtype)
    return SurrogateTerm(-inputs.advantages * inputs.ratio + penalty, covariance_metrics(inputs, selected, "kl_cov"))
