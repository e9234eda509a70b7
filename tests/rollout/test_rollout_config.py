"""The rollout config group: the shipped conf/rollout files, the vllm section, and the start-up checks that tie
the engine to the rest of the config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tokenpo import CONF_DIR
from tokenpo.config import build_config
from tokenpo.errors import ConfigError
from tokenpo.rollout import build_generator
from tokenpo.rollout.config import rollout_config_from_dict

YAMLS = sorted((Path(CONF_DIR) / "rollout").glob("*.yaml"))


def train_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return build_config(compose("train", ["model=tiny", "logger.mode=disabled", *overrides]))


def test_the_hf_vllm_and_vllm_server_engines_ship_a_config():
    assert [path.stem for path in YAMLS] == ["hf", "vllm", "vllm_server"]


def test_vllm_yaml_keeps_the_hf_sampling_keys_and_adds_its_own():
    hf, vllm = train_config().rollout, train_config("rollout=vllm").rollout
    assert vllm.engine == "vllm"
    assert (vllm.group_size, vllm.max_new_tokens, vllm.temperature, vllm.top_p) == \
        (hf.group_size, hf.max_new_tokens, hf.temperature, hf.top_p)
    v = vllm.vllm
    # the sizing keys resolve per device (tokenpo.rollout.config.vllm_sizing, tests/rollout/test_vllm_sizing.py)
    assert (v.dtype, v.gpu_memory_utilization, v.kv_cache_gib, v.enforce_eager) == ("auto", None, None, None)
    assert (v.sleep_mode, v.sleep_level) == (True, 2)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this Python has vllm")
def test_vllm_without_the_package_is_a_one_line_error_when_the_engine_is_built():
    cfg = train_config("rollout=vllm")  # the config itself is valid anywhere
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm needs the 'vllm' package.*setup_vllm.sh"):
        build_generator(cfg.rollout, tokenizer=None, published=None, device=None)


@pytest.mark.parametrize("vllm, message", [
    ({"dtype": "float64"}, "rollout.vllm.dtype must be one of auto, float32, bfloat16, float16"),
    ({"gpu_memory_utilization": 0}, r"rollout.vllm.gpu_memory_utilization must be in \(0, 1\]"),
    ({"kv_cache_gib": 0}, "rollout.vllm.kv_cache_gib must be null or > 0"),
    ({"tensor_parallel_size": 2}, "rollout.vllm.tensor_parallel_size must be 1"),
    ({"swap_space": 4}, "unknown key rollout.vllm.swap_space"),
])
def test_bad_vllm_settings_are_one_line_errors(vllm, message):
    # the section is validated whatever the engine, so a typo fails before a long run switches engines
    with pytest.raises(ConfigError, match=message):
        rollout_config_from_dict({"engine": "hf", "vllm": vllm})


def test_tis_needs_an_engine_that_returns_logprobs():
    with pytest.raises(ConfigError, match="algorithm.loss.tis_cap=2.0 needs the rollout engine's log-probs.*hf"):
        train_config("algorithm.loss.tis_cap=2")
    assert train_config("algorithm.loss.tis_cap=null").algorithm.loss.tis_cap is None
