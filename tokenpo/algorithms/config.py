"""Typed schema of the `algorithm` config group, validated at start-up.

Everything that tells the algorithms apart lives here as data; the trainer composes the
functions of this package from these values and never looks at `name`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenpo.algorithms.advantages import ADVANTAGES, GTPO_NORMS, SCALES, SCOPES, STATS_WEIGHTS
from tokenpo.algorithms.aggregation import AGGREGATIONS
from tokenpo.algorithms.dynamic_sampling import ON_EXHAUSTED
from tokenpo.algorithms.entropy_control import ENTROPY_CONTROLS
from tokenpo.algorithms.kl import ENTROPY_REFERENCES, KL_ESTIMATORS, KL_MASKS, KL_TARGETS
from tokenpo.algorithms.ratios import RATIOS
from tokenpo.algorithms.surrogates import SURROGATES
from tokenpo.schema import build, check_fields, must_be, non_empty, require, section, setting

ROOT = "algorithm"


@dataclass
class RewardValuesConfig:
    """Sequence reward of a correct and of a wrong answer (before shaping); not the `reward` section
    (tokenpo.rewards.RewardConfig), which says how answers are checked."""

    correct: float = setting(1.0, "reward of a correct answer (score); GRPO: 1")
    wrong: float = setting(0.0, "reward of a wrong or unparseable answer (score); GRPO: 0")

    def validate(self, path: str) -> None:
        check_fields(self, path)
        require(self.correct > self.wrong, must_be(f"{path}.correct", f"> {path}.wrong ({self.wrong})", self.correct))


@dataclass
class ShapingConfig:
    soft_overlong: bool = setting(False, "add DAPO's soft overlong punishment to the reward (bool)")
    overlong_cache_frac: float = setting(0.2,
        "DAPO L_cache as a fraction of L_max = rollout max_new_tokens (DAPO: 4096 of 20480 = 0.2); scales with "
        "max_new_tokens, so short CPU runs keep the paper's proportion", gt=0, le=1)
    overlong_filter: bool = setting(False,
        "mask truncated responses out of the loss (bool; DAPO ablation rung, off in final DAPO)")
    grop: bool = setting(False, "add GTPO's group-relative overlong punishment, GTPO App. D (bool)")
    grop_gamma1: float = setting(0.75, "GROP 'easy question' threshold on n/G (fraction; not published, 0.75)",
        gt=0, le=1)
    grop_medium: bool = setting(True,
        "GROP also in 'medium' groups (n > m but n/G < γ1), L+ then over all G lengths, GTPO App. D (bool; paper: true;"
        " read only with grop)")

    def validate(self, path: str) -> None:
        check_fields(self, path)


@dataclass
class AdvantageConfig:
    estimator: str = setting("grpo", "advantage estimator: grpo | gtpo | grpo_s", choices=ADVANTAGES.names)
    scale: str = setting("std", "divide by the std (std) or not (none, Dr. GRPO); GRPO: std", choices=sorted(SCALES))
    eps: float = setting(1e-6, "added to every std and entropy denominator (1e-6 in GRPO)", gt=0)
    alpha1: float = setting(1.0, "GTPO correctness weight α1, Eq. 3/5 (GTPO paper: 1; read by gtpo only)", ge=0)
    alpha2: float = setting(0.1, "GTPO entropy weight α2, Eq. 3/5 (GTPO paper: 0.1; read by gtpo only)", ge=0)
    beta1: float = setting(1.0, "GRPO-S correctness weight β1 (GTPO paper: 1; read by grpo_s only)", ge=0)
    beta2: float = setting(0.1, "GRPO-S entropy weight β2 (GTPO paper: 0.1; read by grpo_s only)", ge=0)
    norm: str = setting("joint",
        "GTPO Eq. 6 normalisation: joint | per_polarity | per_polarity_padded | scale_only (read by gtpo only); joint: "
        "no other reading measured significantly better on the testbed (docs/algorithms.md)", choices=GTPO_NORMS.names)
    scope: str = setting("group",
        "GTPO Eq. 6 statistics over one prompt's responses (group) or the step (batch) (gtpo only)",
        choices=SCOPES.names)
    share_scope: str = setting("group",
        "entropy shares Σ_k H_k and counts d_t, h_t (GTPO Eq. 3/5; GRPO-S: n, m) over one prompt's responses (group) or"
        " the step (batch) (gtpo, grpo_s)", choices=SCOPES.names)
    stats_weight: str = setting("sequence",
        "GTPO Eq. 6 statistics count each response once (sequence) or each token (token) (gtpo only); sequence keeps "
        "the α2 = 0 → DAPO reduction exact", choices=STATS_WEIGHTS.names)
    entropy_bonus_alpha: float = setting(0.0,
        "entropy-based advantage α: every token's advantage A (any estimator) gets + min(α·H, |A|/κ), H the rollout "
        "policy's token entropy, detached (0 = off; Cheng et al. arXiv 2506.14758, entropy-based advantage shaping: "
        "0.4 with GRPO, 0.1 with PPO)", ge=0)
    entropy_bonus_kappa: float = setting(2.0,
        "entropy-based advantage κ > 1: the term is at most |A|/κ, so it never flips A's sign (Cheng et al. arXiv "
        "2506.14758: 2; read only with entropy_bonus_alpha > 0)", gt=1)

    def validate(self, path: str) -> None:
        check_fields(self, path)


@dataclass
class RatioConfig:
    kind: str = setting("token", "token | sequence_arithmetic | sequence_geometric | sequence_token; GRPO: token",
        choices=RATIOS.names)

    def validate(self, path: str) -> None:
        check_fields(self, path)


def masked_kl_reads_entropy(loss: LossConfig) -> bool:
    """Whether the masked KL term is on with a mask that compares entropies (its entropy reference is read)."""
    return loss.kl_mask_coef > 0 and bool(KL_MASKS.trait(loss.kl_mask, "needs_entropy"))


@dataclass
class LossConfig:
    surrogate: str = setting("clipped",
        "per-token policy-gradient term (tokenpo/algorithms/surrogates.py): clipped (PPO/GRPO/DAPO clip) | cispo "
        "(MiniMax-M1 clipped IS weight) | gmpo (geometric-mean sequence ratio) | sapo (soft gate) | clip_cov | kl_cov "
        "(arXiv 2505.22617); GRPO: clipped",
        choices=SURROGATES.names)
    clip_low: float = setting(0.2,
        "ε_low: the ratio is clipped below at 1 − ε_low; GRPO gives none; 0.2 is the convention", ge=0, lt=1)
    clip_high: float = setting(0.2, "ε_high: the ratio is clipped above at 1 + ε_high; symmetric 0.2 in GRPO", ge=0)
    dual_clip: float | None = setting(None, "dual-clip bound c on the loss of A < 0 tokens (null = off; 3.0 is usual)",
        gt=1)
    cispo_clip_low: float | None = setting(None,
        "CISPO ε_low^IS: the detached IS weight is clipped below at 1 − ε_low^IS (null = no lower bound; MiniMax-M1 "
        "arXiv 2506.13585 §3.1 sets no lower bound; read by cispo only)", ge=0, lt=1)
    cispo_clip_high: float = setting(4.0,
        "CISPO ε_high^IS: the detached IS weight is capped at 1 + ε_high^IS (ratio units; MiniMax-M1 §3.1 tunes it, "
        "value not published; 4 = the weight cap ε_max 5 of ScaleRL arXiv 2510.13786 as TRL's GRPOConfig documents "
        "it; read by cispo only)", gt=0)
    gmpo_clip_low: float = setting(0.4,
        "GMPO ε_l: log r_t of an A < 0 token is clipped below at −ε_l (log-ratio units; GMPO arXiv 2507.20673: 0.4, "
        "ratio range (e^−0.4, e^0.4); read by gmpo only)", gt=0)
    gmpo_clip_high: float = setting(0.4,
        "GMPO ε_h: log r_t of an A > 0 token is clipped above at ε_h (log-ratio units; GMPO arXiv 2507.20673: 0.4; "
        "read by gmpo only)", gt=0)
    sapo_tau_pos: float = setting(1.0,
        "SAPO gate temperature τ_pos of A > 0 tokens, f(r) = σ(τ(r − 1))·4/τ (per ratio unit; SAPO arXiv 2511.20347: "
        "1.0; read by sapo only)", gt=0)
    sapo_tau_neg: float = setting(1.05,
        "SAPO gate temperature τ_neg of A ≤ 0 tokens (per ratio unit; SAPO arXiv 2511.20347: 1.05 > τ_pos, negative "
        "updates damped faster; read by sapo only)", gt=0)
    kl_coef: float = setting(0.04, "β of the per-token KL penalty added to the loss (0 = off); GRPO: 0.04", ge=0)
    kl_estimator: str = setting("k3", "KL estimator for both KL terms: k1 | k2 | k3; GRPO: k3",
        choices=KL_ESTIMATORS.names)
    kl_target: str = setting("ref", "policy the β·KL term pulls towards: ref | old; GRPO: ref",
        choices=KL_TARGETS.names, applies=lambda loss: loss.kl_coef > 0)
    kl_mask: str = setting("none", "token-level KL mask: none | tepo", choices=KL_MASKS.names)
    kl_mask_entropy_ref: str = setting("old_token",
        "entropy H_θ is compared with by the mask: old_token | group_mean | batch_mean",
        choices=ENTROPY_REFERENCES.names, applies=masked_kl_reads_entropy)
    kl_mask_target: str = setting("old", "policy the masked KL pulls towards: old | ref", choices=KL_TARGETS.names,
        applies=lambda loss: loss.kl_mask_coef > 0)
    kl_mask_coef: float = setting(0.0, "β_mask of the masked KL (0 = off)", ge=0)
    cov_rho: float = setting(2e-4,
        "Clip-Cov / KL-Cov ρ: k = max(1, ⌊ρ·N⌋) of the N valid tokens of a selection batch are selected (fraction; "
        "read by clip_cov, kl_cov); authors' verl recipe/entropy (arXiv 2505.22617): Clip-Cov 2e-4, KL-Cov 2e-3 "
        "(Qwen2.5-7B) / 2e-4 (32B)", gt=0, le=1)
    cov_clip_low: float = setting(1.0,
        "Clip-Cov ω_low: candidates have Cov > ω_low (covariance units; read by clip_cov); arXiv 2505.22617 verl recipe "
        "clip_cov_lb: 1",
        finite=True)
    cov_clip_high: float = setting(5.0,
        "Clip-Cov ω_high: candidates have Cov < ω_high (covariance units; read by clip_cov); arXiv 2505.22617 verl "
        "recipe clip_cov_ub: 5",
        finite=True)
    kl_cov_coef: float = setting(1.0,
        "KL-Cov β of β·|log π_θ − log π_old| on the selected tokens (loss units; read by kl_cov); arXiv 2505.22617 "
        "verl recipe ppo_kl_coef: 1", ge=0)
    entropy_top_frac: float | None = setting(None,
        "80/20 ρ: only the valid tokens whose entropy is in the top ρ of a selection batch carry the policy gradient, "
        "the rest stay in the normaliser (null = off; arXiv 2506.01939 §5: 0.2; TRL top_entropy_quantile)", gt=0, le=1)
    selection_scope: str = setting("micro_batch",
        "batch a token selection (clip_cov, kl_cov, entropy_top_frac) runs over: micro_batch (the reference codes', "
        "current policy, depends on the split) | step (each mini-batch of the step on every rank, rollout policy's "
        "log-probs and entropy: exact under any micro-batch or rank split); papers: micro_batch",
        choices=("micro_batch", "step"))
    entropy_coef: float = setting(0.0,
        "entropy bonus c: loss −= c · current entropy, aggregated like the loss (0 = off, no entropy gradient kept; "
        "verl entropy_coeff, cleanrl ent_coef, PPO arXiv 1707.06347 Eq. 9 c2; none of our papers: 0; < 0 minimises "
        "entropy)", finite=True)
    entropy_control: str = setting("fixed",
        "entropy bonus coefficient: fixed (entropy_coef every step) | adaptive (Skywork-OR1 arXiv 2505.22312 adaptive "
        "entropy control: c starts at entropy_coef and moves ±entropy_coef_step after each step to hold the step's "
        "entropy/mean near entropy_target, clipped to [0, entropy_coef_max], the bonus on only while below target); "
        "GRPO: fixed", choices=ENTROPY_CONTROLS)
    entropy_target: float = setting(0.2,
        "adaptive control's target entropy H* (tgt-ent; nats per token, the step's entropy/mean; Skywork-OR1 "
        "scripts TGT_ENTROPY: 0.2, for DeepSeek-R1-Distill models; read only with entropy_control=adaptive)", gt=0)
    entropy_coef_step: float = setting(1e-4,
        "adaptive control's step Δ of the coefficient per training step (loss units; Skywork-OR1 scripts "
        "DELTA_ENT_COEF: 1e-4; read only with entropy_control=adaptive)", gt=0)
    entropy_coef_max: float = setting(5e-3,
        "adaptive control's upper clip c_max of the coefficient (loss units; Skywork-OR1 scripts MAX_ENT_COEF: 5e-3, "
        "lower clip 0; read only with entropy_control=adaptive)", gt=0)
    tis_cap: float | None = setting(None,
        "TIS cap C: weight each token's policy-gradient loss by min(π_train/π_sampler, C), the rollout engine's "
        'log-probs as π_sampler (null = off; Yao et al. 2025 "Your Efficient RL Framework Secretly Brings You '
        'Off-Policy RL Training": 2; needs an engine with log-probs, rollout=vllm)', gt=0)
    tis_mode: str = setting("truncate",
        "what a token whose weight π_train/π_sampler passes tis_cap gets: truncate (the weight C: TIS, Yao et al. "
        "2025) | mask (weight 0, the token out of the loss: AReaL's decoupled PPO, behav_imp_weight_cap, Fu et al. "
        "arXiv 2505.24298; its examples use C = 5)", choices=("truncate", "mask"))

    def validate(self, path: str) -> None:
        check_fields(self, path)
        if self.entropy_control == "adaptive":
            # c_0 = entropy_coef starts inside the range the controller clips to
            require(0 <= self.entropy_coef <= self.entropy_coef_max,
                    must_be(f"{path}.entropy_coef", f"in [0, {path}.entropy_coef_max ({self.entropy_coef_max})] with "
                            f"{path}.entropy_control=adaptive (the initial coefficient)", self.entropy_coef))
        require(self.cov_clip_low < self.cov_clip_high,
                must_be(f"{path}.cov_clip_low", f"< {path}.cov_clip_high ({self.cov_clip_high})", self.cov_clip_low))


@dataclass
class DynamicSamplingConfig:
    enabled: bool = setting(False,
        "drop groups whose accuracy is all equal and sample more prompts (bool); off in GRPO")
    # the verl DAPO recipe's values (recipe/dapo/run_dapo_qwen2.5_32b.sh)
    max_gen_batches: int = setting(10,
        "most generation rounds per step (count; DAPO paper: no cap stated; verl DAPO recipe max_num_gen_batches: 10)",
        ge=1)
    oversample: float = setting(3.0,
        "prompts per round = ceil(oversample x data.prompts_per_step), rounded up to a multiple of the processes "
        "(factor >= 1; verl DAPO recipe: gen_batch_size = 3 x train_batch_size)", ge=1)
    on_exhausted: str = setting("error",
        "when the rounds run out with fewer mixed groups than data.prompts_per_step: error | fill (all-equal groups) | "
        "keep_partial (a smaller batch) (verl DAPO recipe: error)", choices=sorted(ON_EXHAUSTED))

    def validate(self, path: str) -> None:
        check_fields(self, path)


@dataclass
class AlgorithmConfig:
    name: str = setting("grpo", "label shown in logs and run names; never used for branching",
        check=non_empty, requirement="a non-empty label")
    reward: RewardValuesConfig = section(RewardValuesConfig,
        "sequence reward from the math-verify verdict")
    shaping: ShapingConfig = section(ShapingConfig,
        "length-based reward shaping and filtering of responses")
    advantage: AdvantageConfig = section(AdvantageConfig, "per-token advantage")
    ratio: RatioConfig = section(RatioConfig, "importance ratio")
    loss: LossConfig = section(LossConfig, "policy-gradient surrogate and KL terms")
    aggregation: str = setting("seq-mean-token-mean",
        "token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm; GRPO: seq-mean-token-mean",
        choices=AGGREGATIONS.names)
    dynamic_sampling: DynamicSamplingConfig = section(DynamicSamplingConfig, "DAPO dynamic sampling")

    def validate(self) -> None:
        check_fields(self, ROOT)
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if dataclasses.is_dataclass(value):
                value.validate(f"{ROOT}.{spec.name}")
        require(not SURROGATES.trait(self.loss.surrogate, "own_ratio") or self.ratio.kind == "token", must_be(
            f"{ROOT}.ratio.kind", f"token with surrogate {self.loss.surrogate!r}, which computes its own per-token "
            "ratio", self.ratio.kind))


def algorithm_config_from_dict(data: Mapping[str, Any]) -> AlgorithmConfig:
    """Build and validate the config from a plain dict (e.g. OmegaConf.to_container(cfg.algorithm));
    absent keys take the GRPO defaults above."""
    return build(AlgorithmConfig, data, ROOT)


def needs_reference(cfg: AlgorithmConfig) -> bool:
    """Whether a KL term (plain or masked) pulls towards the reference policy with a nonzero
    coefficient, i.e. whether the reference model must be loaded and its log-probs computed."""
    loss = cfg.loss
    return (loss.kl_coef > 0 and loss.kl_target == "ref") or (loss.kl_mask_coef > 0 and loss.kl_mask_target == "ref")


def needs_entropy(cfg: AlgorithmConfig) -> bool:
    """Whether the old policy's per-token entropy must be kept for the advantage (its estimator, or the
    entropy-based advantage term), the KL mask or a step-wide 80/20 selection."""
    return (bool(ADVANTAGES.trait(cfg.advantage.estimator, "needs_entropy")) or cfg.advantage.entropy_bonus_alpha > 0
            or masked_kl_reads_entropy(cfg.loss)
            or (cfg.loss.entropy_top_frac is not None and cfg.loss.selection_scope == "step"))


def needs_step_logprobs(cfg: AlgorithmConfig) -> bool:
    """Whether `prepare_step` reads the rollout policy's log-probs of the whole step: a selecting surrogate (trait
    `select`) at selection_scope step."""
    return cfg.loss.selection_scope == "step" and SURROGATES.trait(cfg.loss.surrogate, "select") is not None


def needs_entropy_grad(cfg: AlgorithmConfig) -> bool:
    """Whether the loss differentiates the current policy's entropy (an entropy bonus), i.e. whether the
    update pass must keep the entropy's graph; without it the entropy is computed detached, at no extra cost. Under
    adaptive control always: its coefficient can leave 0 at any step (entropy_coef_max > 0)."""
    return cfg.loss.entropy_control == "adaptive" or cfg.loss.entropy_coef != 0
