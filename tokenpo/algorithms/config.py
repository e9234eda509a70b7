"""Typed schema of the `algorithm` config group, validated at start-up.

Everything that tells the algorithms apart lives here as data; the trainer composes the
functions of this package from these values and never looks at `name`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable

from tokenpo.algorithms.advantages import ADVANTAGES, GTPO_NORMS, SCALES, SCOPES, STATS_WEIGHTS
from tokenpo.algorithms.aggregation import AGGREGATIONS
from tokenpo.algorithms.dynamic_sampling import ON_EXHAUSTED
from tokenpo.algorithms.kl import ENTROPY_REFERENCES, KL_ESTIMATORS, KL_MASKS, KL_TARGETS
from tokenpo.algorithms.ratios import RATIOS
from tokenpo.errors import ConfigError
from tokenpo.schema import from_dict

ROOT = "algorithm"


def _require(ok: bool, key: str, requirement: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {requirement}, got {value!r}")


def _require_choice(value: str, known: Iterable[str], key: str) -> None:
    known = sorted(known)
    _require(value in known, key, f"one of {', '.join(known)}", value)


@dataclass
class RewardValuesConfig:
    """Sequence reward of a correct and of a wrong answer (before shaping); not the `reward` section
    (tokenpo.rewards.RewardConfig), which says how answers are checked."""

    correct: float = 1.0
    wrong: float = 0.0

    def validate(self, path: str) -> None:
        _require(self.correct > self.wrong, f"{path}.correct", f"> {path}.wrong ({self.wrong})", self.correct)


@dataclass
class ShapingConfig:
    soft_overlong: bool = False
    overlong_cache_frac: float = 0.2
    overlong_filter: bool = False
    grop: bool = False
    grop_gamma1: float = 0.75
    grop_medium: bool = True

    def validate(self, path: str) -> None:
        frac = self.overlong_cache_frac
        _require(0 < frac <= 1, f"{path}.overlong_cache_frac", "in (0, 1]", frac)
        _require(0 < self.grop_gamma1 <= 1, f"{path}.grop_gamma1", "in (0, 1]", self.grop_gamma1)


@dataclass
class AdvantageConfig:
    estimator: str = "grpo"
    scale: str = "std"
    eps: float = 1e-6
    alpha1: float = 1.0
    alpha2: float = 0.1
    beta1: float = 1.0
    beta2: float = 0.1
    norm: str = "joint"
    scope: str = "group"
    share_scope: str = "group"
    stats_weight: str = "sequence"

    def validate(self, path: str) -> None:
        _require_choice(self.estimator, ADVANTAGES.names(), f"{path}.estimator")
        _require_choice(self.scale, SCALES, f"{path}.scale")
        _require(self.eps > 0, f"{path}.eps", "> 0", self.eps)
        for name in ("alpha1", "alpha2", "beta1", "beta2"):
            value = getattr(self, name)
            _require(value >= 0, f"{path}.{name}", ">= 0", value)
        _require_choice(self.norm, GTPO_NORMS.names(), f"{path}.norm")
        _require_choice(self.scope, SCOPES.names(), f"{path}.scope")
        _require_choice(self.share_scope, SCOPES.names(), f"{path}.share_scope")
        _require_choice(self.stats_weight, STATS_WEIGHTS.names(), f"{path}.stats_weight")


@dataclass
class RatioConfig:
    kind: str = "token"

    def validate(self, path: str) -> None:
        _require_choice(self.kind, RATIOS.names(), f"{path}.kind")


@dataclass
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.04
    kl_estimator: str = "k3"
    kl_target: str = "ref"
    kl_mask: str = "none"
    kl_mask_entropy_ref: str = "old_token"
    kl_mask_target: str = "old"
    kl_mask_coef: float = 0.0
    entropy_coef: float = 0.0
    tis_cap: float | None = None

    def validate(self, path: str) -> None:
        _require(0 <= self.clip_low < 1, f"{path}.clip_low", "in [0, 1)", self.clip_low)
        _require(self.clip_high >= 0, f"{path}.clip_high", ">= 0", self.clip_high)
        if self.dual_clip is not None:
            _require(self.dual_clip > 1, f"{path}.dual_clip", "null or > 1", self.dual_clip)
        _require(self.kl_coef >= 0, f"{path}.kl_coef", ">= 0", self.kl_coef)
        _require_choice(self.kl_estimator, KL_ESTIMATORS.names(), f"{path}.kl_estimator")
        _require_choice(self.kl_target, KL_TARGETS, f"{path}.kl_target")
        _require_choice(self.kl_mask, KL_MASKS.names(), f"{path}.kl_mask")
        _require_choice(self.kl_mask_entropy_ref, ENTROPY_REFERENCES.names(), f"{path}.kl_mask_entropy_ref")
        _require_choice(self.kl_mask_target, KL_TARGETS, f"{path}.kl_mask_target")
        _require(self.kl_mask_coef >= 0, f"{path}.kl_mask_coef", ">= 0", self.kl_mask_coef)
        # negative is allowed: entropy minimisation is an objective of its own
        _require(math.isfinite(self.entropy_coef), f"{path}.entropy_coef", "a finite number", self.entropy_coef)
        if self.tis_cap is not None:
            _require(self.tis_cap > 0, f"{path}.tis_cap", "null or > 0", self.tis_cap)


@dataclass
class DynamicSamplingConfig:
    enabled: bool = False
    # the verl DAPO recipe's values (recipe/dapo/run_dapo_qwen2.5_32b.sh)
    max_gen_batches: int = 10
    oversample: float = 3.0
    on_exhausted: str = "error"

    def validate(self, path: str) -> None:
        _require(self.max_gen_batches >= 1, f"{path}.max_gen_batches", ">= 1", self.max_gen_batches)
        _require(self.oversample >= 1, f"{path}.oversample", ">= 1", self.oversample)
        _require_choice(self.on_exhausted, ON_EXHAUSTED, f"{path}.on_exhausted")


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    reward: RewardValuesConfig = field(default_factory=RewardValuesConfig)
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    ratio: RatioConfig = field(default_factory=RatioConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    aggregation: str = "seq-mean-token-mean"
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)

    def validate(self) -> None:
        _require(bool(self.name.strip()), f"{ROOT}.name", "a non-empty label", self.name)
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            if dataclasses.is_dataclass(value):
                value.validate(f"{ROOT}.{section.name}")
        _require_choice(self.aggregation, AGGREGATIONS.names(), f"{ROOT}.aggregation")


def algorithm_config_from_dict(data: Mapping[str, Any]) -> AlgorithmConfig:
    """Build and validate the config from a plain dict (e.g. OmegaConf.to_container(cfg.algorithm));
    absent keys take the GRPO defaults above."""
    cfg = from_dict(AlgorithmConfig, data, ROOT)
    cfg.validate()
    return cfg


def needs_reference(cfg: AlgorithmConfig) -> bool:
    """Whether a KL term (plain or masked) pulls towards the reference policy with a nonzero
    coefficient, i.e. whether the reference model must be loaded and its log-probs computed."""
    loss = cfg.loss
    return (loss.kl_coef > 0 and loss.kl_target == "ref") or (loss.kl_mask_coef > 0 and loss.kl_mask_target == "ref")


def needs_entropy(cfg: AlgorithmConfig) -> bool:
    """Whether the old policy's per-token entropy must be kept for the advantage or the KL mask."""
    return bool(ADVANTAGES.trait(cfg.advantage.estimator, "needs_entropy")) or (
        cfg.loss.kl_mask_coef > 0 and bool(KL_MASKS.trait(cfg.loss.kl_mask, "needs_entropy"))
    )


def needs_entropy_grad(cfg: AlgorithmConfig) -> bool:
    """Whether the loss differentiates the current policy's entropy (an entropy bonus), i.e. whether the
    update pass must keep the entropy's graph; without it the entropy is computed detached, at no extra cost."""
    return cfg.loss.entropy_coef != 0
