"""The math of GRPO, DAPO, TEPO, GTPO, GRPO-S, Dr. GRPO and GSPO as small tensor functions.

An algorithm is a config (`AlgorithmConfig`, conf/algorithm/*.yaml) naming registry entries;
the trainer calls `prepare_step` once per step and `micro_batch_loss` per micro-batch, which compose the
functions below, and never branches on the algorithm's name.
See docs/algorithms.md for the equations, shapes and the config keys of each paper.
"""

from tokenpo.algorithms.advantages import ADVANTAGES, group_advantages, token_advantages
from tokenpo.algorithms.aggregation import AGGREGATIONS, LossNorm, aggregate
from tokenpo.algorithms.config import (
    AlgorithmConfig,
    algorithm_config_from_dict,
    needs_entropy,
    needs_entropy_grad,
    needs_reference,
)
from tokenpo.algorithms.dynamic_sampling import partial_batch_size, prompts_per_round, select_mixed_groups
from tokenpo.algorithms.kl import ENTROPY_REFERENCES, KL_ESTIMATORS, KL_MASKS, kl_mask_entropy_reference, kl_penalty
from tokenpo.algorithms.losses import clipped_surrogate, entropy_bonus, policy_loss
from tokenpo.algorithms.metrics import entropy_by_polarity, mean_by_polarity
from tokenpo.algorithms.ratios import RATIOS, importance_ratio
from tokenpo.algorithms.shaping import shape_rewards
from tokenpo.algorithms.step import StepBatch, StepTensors, micro_batch_loss, prepare_step, response_mask

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "ENTROPY_REFERENCES",
    "KL_ESTIMATORS",
    "KL_MASKS",
    "RATIOS",
    "AlgorithmConfig",
    "LossNorm",
    "StepBatch",
    "StepTensors",
    "aggregate",
    "algorithm_config_from_dict",
    "clipped_surrogate",
    "entropy_bonus",
    "entropy_by_polarity",
    "group_advantages",
    "importance_ratio",
    "kl_mask_entropy_reference",
    "kl_penalty",
    "mean_by_polarity",
    "micro_batch_loss",
    "needs_entropy",
    "needs_entropy_grad",
    "needs_reference",
    "partial_batch_size",
    "policy_loss",
    "prepare_step",
    "prompts_per_round",
    "response_mask",
    "select_mixed_groups",
    "shape_rewards",
    "token_advantages",
]
