"""The math of GRPO, DAPO, TEPO, GTPO, GRPO-S, Dr. GRPO and GSPO as small tensor functions.

An algorithm is a config (`AlgorithmConfig`, conf/algorithm/*.yaml) naming registry entries;
the trainer calls `prepare_step` once per step and `micro_batch_loss` per micro-batch, which compose the
functions below, and never branches on the algorithm's name.
See docs/algorithms.md for the equations, shapes and the config keys of each paper.
"""

from tokenpo.lazy import lazy_exports

# imported when first used: the config schema validates a run without torch
__getattr__, __all__ = lazy_exports(__name__, {
    "advantages": ("ADVANTAGES", "entropy_shaped_advantages", "group_advantages", "token_advantages"),
    "aggregation": ("AGGREGATIONS", "LossNorm", "aggregate"),
    "config": ("AlgorithmConfig", "algorithm_config_from_dict", "needs_entropy", "needs_entropy_grad",
               "needs_reference", "needs_step_logprobs"),
    "dynamic_sampling": ("partial_batch_size", "prompts_per_round", "select_mixed_groups"),
    "entropy_control": ("ENTROPY_CONTROLS", "EntropyCoef", "adaptive_entropy_coef", "next_entropy_coef",
                        "step_entropy_coef"),
    "kl": ("ENTROPY_REFERENCES", "KL_ESTIMATORS", "KL_MASKS", "kl_mask_entropy_reference", "kl_penalty"),
    "losses": ("entropy_bonus", "policy_loss"),
    "metrics": ("entropy_by_polarity", "mean_by_polarity"),
    "ratios": ("RATIOS", "importance_ratio"),
    "selection": ("entropy_top_mask", "selection_generator", "token_covariance"),
    "shaping": ("shape_rewards",),
    "surrogates": ("SURROGATES", "SurrogateInputs", "SurrogateTerm", "clipped_surrogate"),
    "step": ("StepBatch", "StepTensors", "micro_batch_loss", "prepare_step", "response_mask"),
})
