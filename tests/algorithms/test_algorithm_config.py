"""The config schema, the shipped conf/algorithm/*.yaml files and the derived helpers."""

from __future__ import annotations

import pytest

from support.config import ALGORITHM_CONF, ALGORITHM_NAMES, algorithm_dict
from tokenpo.algorithms import ADVANTAGES, algorithm_config_from_dict, needs_entropy, needs_entropy_grad, needs_reference
from tokenpo.errors import ConfigError


YAML_FILES = sorted(ALGORITHM_CONF.glob("*.yaml"))


def test_the_seven_papers_ship_a_config():
    assert {"grpo", "dapo", "tepo", "gtpo", "grpo_s", "dr_grpo", "gspo"} <= set(ALGORITHM_NAMES)


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda path: path.stem)
def test_every_yaml_loads_validates_and_names_itself(path):
    cfg = algorithm_config_from_dict(algorithm_dict(path.stem))
    assert cfg.name == path.stem


def test_yaml_values_follow_the_spec(load_algorithm):
    grpo = load_algorithm("grpo")
    assert (grpo.reward.correct, grpo.reward.wrong, grpo.advantage.scale) == (1.0, 0.0, "std")
    assert (grpo.loss.clip_low, grpo.loss.clip_high, grpo.loss.kl_coef) == (0.2, 0.2, 0.04)
    assert (grpo.loss.kl_estimator, grpo.loss.kl_target, grpo.aggregation) == ("k3", "ref", "seq-mean-token-mean")

    dapo = load_algorithm("dapo")
    assert (dapo.reward.correct, dapo.reward.wrong, dapo.shaping.soft_overlong) == (1.0, -1.0, True)
    assert (dapo.loss.clip_low, dapo.loss.clip_high, dapo.loss.kl_coef) == (0.2, 0.28, 0.0)
    assert (dapo.aggregation, dapo.dynamic_sampling.enabled, dapo.dynamic_sampling.max_gen_batches) == ("token-mean", True, 10)
    # verl's DAPO recipe: 3 x the prompt batch per round, an error when 10 rounds fall short
    assert (dapo.dynamic_sampling.oversample, dapo.dynamic_sampling.on_exhausted) == (3.0, "error")

    gtpo = load_algorithm("gtpo")
    assert (gtpo.advantage.estimator, gtpo.advantage.alpha1, gtpo.advantage.alpha2) == ("gtpo", 1.0, 0.1)
    assert (gtpo.advantage.norm, gtpo.advantage.scope, gtpo.aggregation, gtpo.loss.kl_coef) == ("joint", "group", "token-mean", 0.0)

    grpo_s = load_algorithm("grpo_s")
    assert (grpo_s.advantage.estimator, grpo_s.advantage.beta1, grpo_s.advantage.beta2) == ("grpo_s", 1.0, 0.1)
    assert (grpo_s.ratio.kind, grpo_s.aggregation) == ("sequence_arithmetic", "seq-mean-token-mean")

    tepo = load_algorithm("tepo")
    assert (tepo.advantage.estimator, tepo.ratio.kind, tepo.aggregation) == ("grpo", "sequence_token", "token-mean")
    assert (tepo.loss.kl_mask, tepo.loss.kl_mask_target, tepo.loss.kl_mask_coef) == ("tepo", "old", 0.05)
    assert (tepo.loss.kl_mask_entropy_ref, tepo.loss.kl_coef) == ("old_token", 0.0)

    dr_grpo = load_algorithm("dr_grpo")
    assert (dr_grpo.advantage.scale, dr_grpo.aggregation, dr_grpo.loss.kl_coef) == ("none", "seq-mean-token-sum-norm", 0.0)

    gspo = load_algorithm("gspo")
    assert (gspo.ratio.kind, gspo.loss.clip_low, gspo.loss.clip_high) == ("sequence_geometric", 3e-4, 4e-4)
    assert (gspo.aggregation, gspo.loss.kl_coef) == ("seq-mean-token-mean", 0.0)


def test_absent_keys_take_the_grpo_defaults():
    assert algorithm_config_from_dict({}) == algorithm_config_from_dict(algorithm_dict("grpo"))


@pytest.mark.parametrize(
    "data, message",
    [
        # the known keys are listed in order; only the start of the list is fixed here, so new keys do not move it
        ({"loss": {"clip_lo": 0.2}}, "unknown key algorithm.loss.clip_lo (known: "),
        ({"optimizer": {}}, "unknown key algorithm.optimizer (known: advantage, aggregation,"),
        ({"advantage": {"estimator": "ppo"}}, f"algorithm.advantage.estimator must be one of {', '.join(ADVANTAGES.names())}, got 'ppo'"),
        ({"ratio": {"kind": "seq"}}, "algorithm.ratio.kind must be one of sequence_arithmetic, sequence_geometric, sequence_token, token"),
        ({"aggregation": "mean"}, "algorithm.aggregation must be one of seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, token-mean"),
        ({"loss": {"kl_mask": "x"}}, "algorithm.loss.kl_mask must be one of none, tepo"),
        ({"loss": {"kl_estimator": "k4"}}, "algorithm.loss.kl_estimator must be one of k1, k2, k3"),
        ({"advantage": {"norm": "both"}}, "algorithm.advantage.norm must be one of joint, per_polarity, per_polarity_padded, scale_only"),
        ({"advantage": {"share_scope": "prompt"}}, "algorithm.advantage.share_scope must be one of batch, group, got 'prompt'"),
        ({"loss": {"clip_low": 1.5}}, "algorithm.loss.clip_low must be in [0, 1), got 1.5"),
        ({"loss": {"dual_clip": 0.5}}, "algorithm.loss.dual_clip must be null or > 1, got 0.5"),
        ({"loss": {"kl_coef": -0.1}}, "algorithm.loss.kl_coef must be >= 0, got -0.1"),
        ({"loss": {"entropy_coef": float("nan")}}, "algorithm.loss.entropy_coef must be a finite number, got nan"),
        ({"reward": {"correct": 0.0, "wrong": 0.0}}, "algorithm.reward.correct must be > algorithm.reward.wrong"),
        ({"shaping": {"overlong_cache_frac": 0.0}}, "algorithm.shaping.overlong_cache_frac must be in (0, 1], got 0.0"),
        ({"dynamic_sampling": {"max_gen_batches": 0}}, "algorithm.dynamic_sampling.max_gen_batches must be >= 1, got 0"),
        ({"dynamic_sampling": {"enabled": "yes"}}, "algorithm.dynamic_sampling.enabled must be bool, got 'yes'"),
        ({"dynamic_sampling": {"max_gen_batches": 2.5}}, "algorithm.dynamic_sampling.max_gen_batches must be int, got 2.5"),
        ({"dynamic_sampling": {"oversample": 0.5}}, "algorithm.dynamic_sampling.oversample must be >= 1, got 0.5"),
        ({"dynamic_sampling": {"on_exhausted": "retry"}},
         "algorithm.dynamic_sampling.on_exhausted must be one of error, fill, keep_partial, got 'retry'"),
        ({"loss": {"clip_high": True}}, "algorithm.loss.clip_high must be float, got True"),
        ({"loss": {"cispo_clip_low": 1.0}}, "algorithm.loss.cispo_clip_low must be null or in [0, 1), got 1.0"),
        ({"loss": {"cispo_clip_high": 0.0}}, "algorithm.loss.cispo_clip_high must be > 0, got 0.0"),
        ({"loss": {"gmpo_clip_low": -0.4}}, "algorithm.loss.gmpo_clip_low must be > 0, got -0.4"),
        ({"loss": {"sapo_tau_neg": 0.0}}, "algorithm.loss.sapo_tau_neg must be > 0, got 0.0"),
        ({"loss": {"surrogate": "gmpo"}, "ratio": {"kind": "sequence_geometric"}},
         "algorithm.ratio.kind must be token with surrogate 'gmpo', which computes its own per-token ratio, got "
         "'sequence_geometric'"),
        ({"loss": "fast"}, "algorithm.loss must be a mapping, got 'fast'"),
    ],
)
def test_bad_values_raise_one_line_errors_naming_the_key(data, message):
    with pytest.raises(ConfigError) as error:
        algorithm_config_from_dict(data)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_ints_are_accepted_for_float_fields():
    cfg = algorithm_config_from_dict({"reward": {"correct": 1, "wrong": -1}, "loss": {"dual_clip": 3}})
    assert (cfg.reward.wrong, cfg.loss.dual_clip) == (-1.0, 3.0)
    assert isinstance(cfg.loss.dual_clip, float)


@pytest.mark.parametrize(
    "name, reference, entropy",
    [
        ("grpo", True, False),
        ("dapo", False, False),
        ("tepo", False, True),
        ("gtpo", False, True),
        ("grpo_s", False, True),
        ("dr_grpo", False, False),
        ("gspo", False, False),
    ],
)
def test_needs_reference_and_needs_entropy(load_algorithm, name, reference, entropy):
    cfg = load_algorithm(name)
    assert (needs_reference(cfg), needs_entropy(cfg)) == (reference, entropy)


def test_needs_follow_the_coefficients_and_targets(load_algorithm):
    assert not needs_reference(load_algorithm("grpo", loss={"kl_coef": 0.0}))
    assert not needs_reference(load_algorithm("grpo", loss={"kl_target": "old"}))
    assert needs_reference(load_algorithm("tepo", loss={"kl_mask_target": "ref"}))
    assert not needs_entropy(load_algorithm("tepo", loss={"kl_mask_coef": 0.0}))
    assert not needs_entropy(load_algorithm("tepo", loss={"kl_mask": "none"}))


def test_needs_entropy_grad_follows_the_entropy_coefficient(load_algorithm):
    assert not needs_entropy_grad(load_algorithm("grpo"))
    assert needs_entropy_grad(load_algorithm("grpo", loss={"entropy_coef": 0.001}))
    # entropy minimisation is an objective too
    assert needs_entropy_grad(load_algorithm("grpo", loss={"entropy_coef": -0.001}))


def test_entropy_baseline_yaml_values_follow_their_papers(load_algorithm):
    cispo = load_algorithm("cispo")
    assert (cispo.loss.surrogate, cispo.loss.cispo_clip_low, cispo.loss.cispo_clip_high) == ("cispo", None, 4.0)
    assert (cispo.aggregation, cispo.loss.kl_coef, cispo.reward.wrong) == ("token-mean", 0.0, 0.0)

    gmpo = load_algorithm("gmpo")
    assert (gmpo.loss.surrogate, gmpo.loss.gmpo_clip_low, gmpo.loss.gmpo_clip_high) == ("gmpo", 0.4, 0.4)
    assert (gmpo.ratio.kind, gmpo.aggregation, gmpo.loss.kl_coef) == ("token", "seq-mean-token-mean", 0.0)

    sapo = load_algorithm("sapo")
    assert (sapo.loss.surrogate, sapo.loss.sapo_tau_pos, sapo.loss.sapo_tau_neg) == ("sapo", 1.0, 1.05)
    assert (sapo.ratio.kind, sapo.aggregation, sapo.loss.kl_coef) == ("token", "seq-mean-token-mean", 0.0)
